"""Read-only mappings pickle as read-only mappings, so frozen dataclasses holding them cross processes."""

import pickle
from types import MappingProxyType

import pytest

from kdvfs.common.frozen import frozen
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.trace import TraceMeta


def test_a_frozen_mapping_is_a_read_only_copy_and_pickles_as_one() -> None:
    source = {"a": 1.0}
    view = frozen(source)
    source["a"] = 2.0
    back = pickle.loads(pickle.dumps(view))
    assert isinstance(back, MappingProxyType) and back == {"a": 1.0} and view == {"a": 1.0}
    with pytest.raises(TypeError):
        back["a"] = 3.0  # type: ignore[index]


def test_a_trace_meta_and_a_gpu_profile_survive_pickling() -> None:
    meta = TraceMeta("NVIDIA H200", "w", "test", measurements={"step_time_s": 0.1})
    profile = load_profile("h200")
    assert pickle.loads(pickle.dumps(meta)) == meta
    assert pickle.loads(pickle.dumps(profile)) == profile
