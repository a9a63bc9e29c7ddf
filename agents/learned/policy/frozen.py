"""Frozen policies: a trained actor in one small ``.npz`` file, run with numpy and compiled numba kernels.

The file holds the actor MLP's weights, the observation normalisation, the environment's settings
(:class:`~kdvfs.envs.env.config.EnvConfig`: they define the observation and the clock grid), the GPU
profile it was trained for and the hash of its observation spec. :meth:`FrozenPolicy.load` refuses another
profile, another observation layout, or a damaged file with a :class:`~kdvfs.common.errors.KdvfsError`.
Neither stable-baselines3 nor torch is imported."""

from __future__ import annotations

import itertools
import json
import zipfile
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np

from kdvfs.agents.learned.policy.forward import RELU, TANH, act
from kdvfs.common.arrays import Array
from kdvfs.common.config import ConfigError, from_mapping, to_plain
from kdvfs.common.errors import KdvfsError
from kdvfs.common.files import write_bytes_atomic
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.observing.measured import ResidualSpec, policy_spec
from kdvfs.envs.env.observing.observation import ObservationSpec
from kdvfs.envs.env.steps.clock_grid import ClockGrid
from kdvfs.envs.gpu.profiles import GpuProfile

FORMAT = "kdvfs-policy"
VERSION = 1
ACTIVATIONS = {"tanh": TANH, "relu": RELU}
"""Hidden-layer activations by name, as :mod:`kdvfs.agents.learned.policy.forward` codes them."""
REMOVED_SETTINGS = {"plan_actions": True}
"""Environment settings that policy files of earlier versions store and this version no longer has, with the only
value it runs (``plan_actions``: the action picks a plan; its alternative, a clock pair or a window advisor, left)."""


class PolicyFileError(KdvfsError):
    """A frozen-policy file is damaged, foreign, or made for another GPU or observation layout."""


@dataclass(frozen=True)
class FrozenPolicy:
    """A deterministic actor: normalise the observation, run the MLP, take each action part's argmax.

    Attributes:
        gpu: the GPU profile name it was trained for.
        spec_hash: :meth:`kdvfs.envs.env.observing.observation.ObservationSpec.hash` of its observations.
        env: the environment settings it was trained with, as stored (:attr:`config` reads them;
            ``core_fractions``, ``memory_mhz``, ``next_kernels``, ``window_latencies`` and ``plan_budgets``
            define the observation).
        nvec: sizes of the action parts (request, core level, memory clock).
        activation: hidden-layer activation, ``tanh`` or ``relu``.
        weights: (in, out) float32 matrices of each layer, the action logits last.
        biases: (out,) float32 vectors of each layer.
        obs_mean, obs_var: (N,) running observation statistics; obs_clip and obs_epsilon as VecNormalize.
        meta: what produced it (config, timesteps, revision), for the record.
    """

    gpu: str
    spec_hash: str
    env: dict[str, Any]
    nvec: tuple[int, ...]
    activation: str
    weights: tuple[Array, ...]
    biases: tuple[Array, ...]
    obs_mean: Array
    obs_var: Array
    obs_clip: float
    obs_epsilon: float
    meta: dict[str, Any]
    config: EnvConfig = field(init=False, repr=False, compare=False)
    _mean32: Array = field(init=False, repr=False, compare=False)
    _inverse_std32: Array = field(init=False, repr=False, compare=False)
    _layers: tuple[tuple[Array, Array, Array], ...] = field(init=False, repr=False, compare=False)
    _later_layers: tuple[tuple[Array, Array, Array], ...] = field(init=False, repr=False, compare=False)
    _activation_code: int = field(init=False, repr=False, compare=False)
    _bounds: Array = field(init=False, repr=False, compare=False)
    _no_product: Array = field(init=False, repr=False, compare=False)
    _first_row: Array = field(init=False, repr=False, compare=False)
    _rest_inputs: dict[int, tuple[tuple[Array, Array, Array], Array, Array]] = field(init=False, repr=False,
                                                                                       compare=False)

    def __post_init__(self) -> None:
        settings = {key: value for key, value in self.env.items() if key not in REMOVED_SETTINGS}
        for key, value in REMOVED_SETTINGS.items():
            if self.env.get(key, value) != value:
                raise PolicyFileError(f"the policy was trained with {key}={self.env[key]!r}, an action design this "
                                      f"version no longer has (only {key}={value!r}); retrain it with `kdvfs train`")
        object.__setattr__(self, "config", from_mapping(EnvConfig, settings, "the policy's environment settings"))
        object.__setattr__(self, "_mean32", self.obs_mean.astype(np.float32))
        object.__setattr__(self, "_inverse_std32", (1.0 / np.sqrt(self.obs_var + self.obs_epsilon)).astype(np.float32))
        object.__setattr__(self, "_bounds", np.cumsum([0, *self.nvec]).astype(np.int64))
        object.__setattr__(self, "_layers", tuple(
            (np.array(w, dtype=np.float32, order="C"), np.array(b, dtype=np.float32),
             np.empty(len(b), dtype=np.float32)) for w, b in zip(self.weights, self.biases, strict=True)))
        object.__setattr__(self, "_later_layers", self._layers[1:])
        object.__setattr__(self, "_activation_code", ACTIVATIONS[self.activation])
        object.__setattr__(self, "_no_product", np.zeros((1, len(self.biases[0])), dtype=np.float32))
        object.__setattr__(self, "_first_row", np.zeros(1, dtype=np.int64))
        object.__setattr__(self, "_rest_inputs", {})

    def grid(self, profile: GpuProfile) -> ClockGrid:
        """The clock grid of this policy on ``profile``."""
        return self.config.grid(profile)

    def spec(self, profile: GpuProfile) -> ObservationSpec | ResidualSpec:
        """The observation spec this policy expects on ``profile`` (a residual policy's: its measured
        observation, :mod:`kdvfs.envs.env.observing.measured`)."""
        spec = self.config.observation_spec(self.grid(profile))
        return policy_spec(spec) if self.config.residual_actions else spec

    def act(self, observation: Array) -> Array:
        """The deterministic action (one int per action part) for one raw observation, as VecNormalize and
        SB3's ``predict(deterministic=True)`` compute it (here all in float32, compiled:
        :mod:`kdvfs.agents.learned.policy.forward`). Works in buffers of the policy: not for concurrent use from
        several threads."""
        return self.act_from(self._no_product, self._first_row, observation)

    def first_products(self, observations: Array, start: int, stop: int) -> Array:
        """(D, H) float32: the first layer's weights times entries ``start:stop`` of the (D, N) observations,
        normalised and clipped as :meth:`act` does (its sum over disjoint ranges is its first product)."""
        x = (np.asarray(observations, dtype=np.float32) - self._mean32[start:stop]) * self._inverse_std32[start:stop]
        np.clip(x, -self.obs_clip, self.obs_clip, out=x)
        return x @ self._layers[0][0][start:stop]

    def act_from(self, products: Array, picks: Array, rest: Array) -> Array:
        """:meth:`act` of an observation whose entries before ``N - len(rest)`` gave the sum of the rows
        ``picks`` (n,) int64 of ``products`` (P, H) float32 (rows of :meth:`first_products` of disjoint ranges
        that cover them) and whose other entries are ``rest``: a few microseconds of compiled
        code holding the interpreter lock (a controller thread beside a busy training loop does not wait to
        get it back)."""
        first, mean, inverse_std = self._rest_input(len(self.obs_mean) - len(rest))
        return act(first, rest, mean, inverse_std, self.obs_clip, products, picks, self._later_layers, self._bounds,
                   self._activation_code)

    def forward_inputs(self, start: int) -> tuple[Any, ...]:
        """What :func:`~kdvfs.agents.learned.policy.forward.act` takes of this policy for an observation whose entries
        from ``start`` on are multiplied at each call: (first layer, mean, inverse std, clip, later layers,
        action bounds, activation code)."""
        first, mean, inverse_std = self._rest_input(start)
        return first, mean, inverse_std, self.obs_clip, self._later_layers, self._bounds, self._activation_code

    def _rest_input(self, start: int) -> tuple[tuple[Array, Array, Array], Array, Array]:
        """The first layer with its weights' (N - start, H) rows of entries ``start:``, and those entries'
        normalisation (made once per start)."""
        found = self._rest_inputs.get(start)
        if found is None:
            weight, bias, out = self._layers[0]
            found = self._rest_inputs[start] = ((weight[start:], bias, out), self._mean32[start:],
                                                self._inverse_std32[start:])
        return found

    def save(self, path: Path) -> None:
        """Write the policy to one ``.npz`` file (atomically)."""
        header = {"format": FORMAT, "version": VERSION, "gpu": self.gpu, "spec_hash": self.spec_hash, "env": self.env,
                  "nvec": list(self.nvec), "activation": self.activation, "obs_clip": self.obs_clip,
                  "obs_epsilon": self.obs_epsilon, "layers": len(self.weights), "meta": self.meta}
        arrays: dict[str, Any] = {"header": np.array(json.dumps(header)), "obs_mean": self.obs_mean,
                                  "obs_var": self.obs_var}
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            arrays[f"w{i}"], arrays[f"b{i}"] = weight, bias
        buffer = BytesIO()
        np.savez_compressed(buffer, **arrays)
        write_bytes_atomic(Path(path), buffer.getvalue())

    @classmethod
    def load(cls, path: Path, profile: GpuProfile) -> FrozenPolicy:
        """Read a policy for ``profile``; another profile, spec or a damaged file is a :class:`PolicyFileError`."""
        policy = _read(Path(path))
        if policy.gpu != profile.name:
            raise PolicyFileError(f"{path}: policy was trained for GPU {policy.gpu!r}, not {profile.name!r}; "
                                  f"train one with `kdvfs train --gpu {profile.name}`")
        expected = policy.spec(profile).hash()
        if policy.spec_hash != expected:
            raise PolicyFileError(f"{path}: observation spec {policy.spec_hash} differs from this version's "
                                  f"{expected} for {profile.name!r} (environment or profile clocks changed); "
                                  "retrain the policy")
        if policy.obs_mean.shape != (policy.spec(profile).size,):
            raise PolicyFileError(f"{path}: normalisation has {policy.obs_mean.shape} entries, the spec "
                                  f"{policy.spec(profile).size}; the file is damaged")
        return policy


def _read(path: Path) -> FrozenPolicy:
    """Parse a policy file without checking it against a profile."""
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(str(data["header"]))
            if header.get("format") != FORMAT or header.get("version") != VERSION:
                raise PolicyFileError(f"{path}: not a {FORMAT} version {VERSION} file")
            layers = int(header["layers"])
            weights = tuple(data[f"w{i}"].astype(np.float32) for i in range(layers))
            biases = tuple(data[f"b{i}"].astype(np.float32) for i in range(layers))
            policy = _from_parts(header, weights, biases, data["obs_mean"], data["obs_var"])
    except FileNotFoundError:
        raise PolicyFileError(f"{path}: no such policy file") from None
    except IsADirectoryError:
        raise PolicyFileError(f"{path} is a folder, expected a policy file (.kdvfs-policy.npz)") from None
    except (OSError, EOFError, ValueError, KeyError, TypeError, ConfigError, zipfile.BadZipFile,
            json.JSONDecodeError) as error:
        raise PolicyFileError(f"{path}: damaged or not a kdvfs policy file ({_reason(error)}); pass a "
                              "frozen policy (.kdvfs-policy.npz from `kdvfs train`) or a plan") from None
    return policy


def _reason(error: Exception) -> str:
    """Why a file is no policy, in kdvfs's words: numpy's advice to unpickle an unknown file (it reads any
    non-archive as a pickle) is never passed on."""
    if "pickle" in str(error):
        return "not a numpy .npz archive"
    return f"{type(error).__name__}: {str(error)[:80]}"


def _from_parts(header: dict[str, Any], weights: tuple[Array, ...], biases: tuple[Array, ...], obs_mean: Array,
             obs_var: Array) -> FrozenPolicy:
    """A policy from a parsed header and arrays; shapes must chain (``ValueError`` otherwise)."""
    sizes = [w.shape for w in weights]
    if any(a[1] != b[0] for a, b in itertools.pairwise(sizes)) or sizes[-1][1] != sum(header["nvec"]) \
            or sizes[0][0] != len(obs_mean) or header["activation"] not in ACTIVATIONS:
        raise ValueError(f"inconsistent layer shapes {sizes} or activation {header['activation']!r}")
    return FrozenPolicy(gpu=header["gpu"], spec_hash=header["spec_hash"], env=header["env"],
                        nvec=tuple(header["nvec"]), activation=header["activation"], weights=weights, biases=biases,
                        obs_mean=obs_mean.astype(np.float64), obs_var=obs_var.astype(np.float64),
                        obs_clip=float(header["obs_clip"]), obs_epsilon=float(header["obs_epsilon"]),
                        meta=header["meta"])


def freeze(model: Any, obs_mean: Array, obs_var: Array, obs_clip: float, obs_epsilon: float, gpu: str,
           spec: ObservationSpec | ResidualSpec, env: EnvConfig, meta: dict[str, Any]) -> FrozenPolicy:
    """Export the actor of a trained SB3 ``PPO`` ``model`` (MLP policy, MultiDiscrete actions).

    Args:
        model: the trained model (duck-typed: ``model.policy.mlp_extractor.policy_net``, ``action_net``).
        obs_mean, obs_var: VecNormalize's observation statistics (zeros and ones without normalisation).
        obs_clip, obs_epsilon: VecNormalize's ``clip_obs`` and ``epsilon``.
        gpu: the profile name.
        spec: the observation spec of the training environment.
        env: the environment's settings (stored as :attr:`FrozenPolicy.env`).
        meta: provenance to store.
    """
    layers = [m for m in model.policy.mlp_extractor.policy_net if hasattr(m, "weight")]
    kinds = {type(m).__name__.lower() for m in model.policy.mlp_extractor.policy_net if not hasattr(m, "weight")}
    if len(kinds) > 1 or not kinds <= set(ACTIVATIONS):
        raise KdvfsError(f"cannot freeze a policy network with activations {sorted(kinds)}")
    layers.append(model.policy.action_net)
    weights = tuple(m.weight.detach().cpu().numpy().T.astype(np.float32) for m in layers)
    biases = tuple(m.bias.detach().cpu().numpy().astype(np.float32) for m in layers)
    header = {"gpu": gpu, "spec_hash": spec.hash(), "env": to_plain(env),
              "nvec": [int(n) for n in model.action_space.nvec], "activation": kinds.pop() if kinds else "tanh",
              "obs_clip": obs_clip, "obs_epsilon": obs_epsilon, "meta": meta}
    mean, var = np.array(obs_mean, dtype=np.float64), np.array(obs_var, dtype=np.float64)
    return _from_parts(header, weights, biases, mean, var)
