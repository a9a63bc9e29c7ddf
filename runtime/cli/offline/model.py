"""``kdvfs model convert|fit|validate``: calibrate and validate the cost model on measurement sweeps."""

from __future__ import annotations

import argparse
from pathlib import Path

from kdvfs.common.errors import KdvfsError
from kdvfs.common.files import write_text_atomic
from kdvfs.envs.calibration.convert import WANG_CHU_BUS_BYTES, convert_h200_default, convert_wang_chu
from kdvfs.envs.calibration.sweep import load_sweep, sweep_path, sweep_to_csv
from kdvfs.envs.gpu.profile_io import write_cost_model
from kdvfs.envs.gpu.profiles import load_profile, profile_path
from kdvfs.runtime.cli.arguments import add_output, check_output_file, resolved
from kdvfs.runtime.cli.render import console, print_json

SWEEP_HELP = "sweep CSV (see docs/design/cost-model.md) or bundled sweep name (gtx980, gtx1080ti, h200-default)"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("model", help="calibrate and validate the cost model")
    commands = parser.add_subparsers(dest="model_command", required=True, metavar="ACTION")

    convert = commands.add_parser("convert", help="convert measurements to the sweep schema")
    convert.add_argument("kind", choices=("wang-chu", "h200-default"), help="source format")
    convert.add_argument("source", type=Path, help="Wang & Chu CSV, or the folder of the H200 default-clock data")
    add_output(convert, "sweep CSV to write", required=True)
    convert.add_argument("--gpu", choices=sorted(WANG_CHU_BUS_BYTES), help="GPU of a Wang & Chu sweep")
    convert.set_defaults(func=run_convert)

    fit = commands.add_parser("fit", help="fit a GPU profile's cost-model parameters to a sweep")
    fit.add_argument("--sweep", required=True, help=SWEEP_HELP)
    fit.add_argument("--gpu", required=True, help="profile name or .yaml to start from")
    fit.add_argument("--fix", default="", help="comma-separated parameters to keep at the profile's values")
    destination = fit.add_mutually_exclusive_group()
    add_output(destination, "write the calibrated profile here")
    destination.add_argument("--write", action="store_true", help="update the profile file in place")
    fit.set_defaults(func=run_fit)

    validate = commands.add_parser("validate", help="k-fold leave-kernels-out validation on a sweep")
    validate.add_argument("--sweep", required=True, help=SWEEP_HELP)
    validate.add_argument("--folds", type=int, default=5, help="number of folds over kernels (default 5)")
    validate.add_argument("--seed", type=int, default=0, help="seed of the kernel shuffle (default 0)")
    validate.add_argument("--json", action="store_true", help="print JSON for scripts")
    validate.set_defaults(func=run_validate)


def run_convert(args: argparse.Namespace) -> int:
    check_output_file(args.output, [args.source])
    if args.kind == "wang-chu":
        if args.gpu is None:
            raise KdvfsError(f"--gpu is required for wang-chu sweeps ({', '.join(sorted(WANG_CHU_BUS_BYTES))})")
        sweep = convert_wang_chu(args.source, args.gpu)
    else:
        sweep = convert_h200_default(args.source)
    write_text_atomic(args.output, sweep_to_csv(sweep))
    console.print(f"wrote {args.output}: {len(sweep.kernel_names)} kernels, {len(sweep.time_s)} rows")
    return 0


def run_fit(args: argparse.Namespace) -> int:
    from kdvfs.envs.calibration.calibrate import calibrate

    check_output_file(args.output, [resolved(args.sweep, sweep_path), profile_path(args.gpu)])
    profile = load_profile(args.gpu)
    result = calibrate(profile, load_sweep(args.sweep), [n for n in args.fix.split(",") if n])
    for name, entry in result.entries.items():
        marker = "fitted" if name in result.fitted else entry.status
        console.print(f"{name:<24} {entry.value:>12.5g}  {marker}")
    console.print(f"in-sample error: time {result.time_mape:.1%}, power (utilisations only) {result.power_mape:.1%}")
    if args.write or args.output:
        target = profile_path(args.gpu) if args.write else args.output
        write_cost_model(profile_path(args.gpu), result.entries, target)
        console.print(f"wrote {target}")
    return 0


def run_validate(args: argparse.Namespace) -> int:
    from kdvfs.envs.calibration.fit import cross_validate

    report = cross_validate(load_sweep(args.sweep), folds=args.folds, seed=args.seed)
    if args.json:
        print_json(report.as_json())
        return 0
    console.print(f"{args.sweep}: {report.kernels} kernels, {report.points} held-out points, {args.folds}-fold")
    console.print(f"time  MAPE {report.time_mape:.1%}  median {report.time_median_ape:.1%}")
    console.print(f"power MAPE {report.power_mape:.1%}  median {report.power_median_ape:.1%}  "
                  f"(from utilisations only: {report.power_mape_utilisation_only:.1%})")
    console.print(f"worst kernel: {report.worst_kernel} ({report.worst_kernel_mape:.1%})")
    return 0
