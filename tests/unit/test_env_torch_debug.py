"""``hwdist env`` shows torch's own collective debugging variables beside hwdist's."""

from __future__ import annotations

from hwdist.cli_env import environment_variables


def test_torch_flight_recorder_and_nan_check_variables_are_listed():
    env = {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": "/tmp/fr_",
        "TORCH_DIST_NAN_CHECK": "1",
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
        "TORCH_GLOO_LAZY_INIT": "1",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "100",
        "NCCL_DEBUG": "INFO",
        "UNRELATED": "x",
    }
    shown = environment_variables(env)
    assert set(shown) == set(env) - {"UNRELATED"}
    assert shown["TORCH_FR_BUFFER_SIZE"] == "2000"
