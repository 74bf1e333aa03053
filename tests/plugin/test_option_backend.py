def cuda_available() -> bool:
    """Asked in this process: tests/plugin/conftest.py imports torch before any inner session
    (so pytester's module snapshots already hold it), and a subprocess would pay ~3 CPU-s to
    import torch again."""
    import torch

    return torch.cuda.is_available()


def test_invalid_backend_is_a_usage_error(pytester):
    result = pytester.runpytest("--spikecheck-backend", "cuda-fast")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--spikecheck-backend*expected one of auto, torch, cupy, emulator, was 'cuda-fast'*"])


def test_invalid_ini_value_is_a_usage_error(pytester):
    pytester.makeini("[pytest]\nspikecheck_backend = gpu\n")
    result = pytester.runpytest("--spikecheck")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*ini option spikecheck_backend: expected one of*"])


def test_torch_backend_is_reported_and_used(tiny):
    tiny.makepyfile(
        test_backend="""
def test_backend(tiny_break):
    assert tiny_break.meta["backend"] == "torch"
"""
    )
    result = tiny.runpytest("--spikecheck", "--spikecheck-backend", "torch")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["spikecheck: backend torch (asked: torch)*"])


def test_cupy_without_a_gpu_is_one_usage_error_before_any_training(tiny):
    from pytest_spikecheck.clipping import unavailable_reason

    if unavailable_reason("cupy") is None:  # on a GPU machine the cupy path is tested elsewhere
        return
    result = tiny.runpytest("--spikecheck", "--spikecheck-backend", "cupy", "--spikecheck-device", "cpu")
    assert result.ret == 4  # a usage error: no test ran, nothing trained
    result.stderr.fnmatch_lines(["*spikecheck: clipping backend 'cupy' cannot run here: *use --backend torch or auto"])
    assert "Traceback" not in result.stderr.str() and "BackendUnavailableError" not in result.stdout.str()


def test_a_cuda_device_on_a_cpu_machine_is_one_usage_error(tiny):
    if cuda_available():
        return
    result = tiny.runpytest("--spikecheck", "--spikecheck-device", "cuda")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*spikecheck: device 'cuda' needs a CUDA device, and there is none usable here*"])
    assert "error" not in result.stdout.str().lower()  # not one setup error per test


PROBE = """
import ctypes, json, sys

from pytest_spikecheck.plugin import _cuda_device_present

present = _cuda_device_present()
try:
    ctypes.CDLL("libcuda.so.1")
    driver = True
except OSError:
    driver = False
print(json.dumps({"present": present, "torch": "torch" in sys.modules, "driver": driver}))
"""


def test_the_header_knows_a_machine_without_the_cuda_driver_without_importing_torch():
    """The header's "is this a CUDA machine" is printed by processes that train nothing (an xdist
    session's controller): without the driver's libcuda.so.1 no CUDA device is usable, so the
    answer is False and torch is not imported for it (its 2 CPU-s start-up); with the driver it
    is torch's own answer. In a fresh interpreter, where nothing has imported torch yet."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(done.stdout)
    assert seen["present"] == cuda_available()
    if sys.platform.startswith("linux") and not seen["driver"]:
        assert seen == {"present": False, "torch": False, "driver": False}
