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
    tiny.makepyfile(test_backend='''
def test_backend(tiny_break):
    assert tiny_break.meta["backend"] == "torch"
''')
    result = tiny.runpytest("--spikecheck", "--spikecheck-backend", "torch")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["spikecheck: backend torch (asked: torch)*"])


def test_cupy_without_a_gpu_says_why(tiny):
    from pytest_spikecheck.clipping import unavailable_reason

    if unavailable_reason("cupy") is None:  # on a GPU machine the cupy path is tested elsewhere
        return
    result = tiny.runpytest("--spikecheck", "--spikecheck-backend", "cupy", "--spikecheck-device", "cpu", "-x")
    result.stdout.fnmatch_lines(["*spikecheck: cupy backend unavailable*"])
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*BackendUnavailableError*"])
