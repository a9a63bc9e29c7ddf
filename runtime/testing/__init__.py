"""Test doubles, chosen explicitly and never as a fallback: the cost-model fake GPU with its virtual clock and
step timeline (``fake_gpu``), a virtual clock that runs a script as its time passes (``scripted_clock``), fake NVML
bindings (``fake_nvml``) and the one importable by name (``--nvml-module kdvfs.runtime.testing.nvml``). Production
code never imports this package; a user names a fake NVML binding on the command line."""
