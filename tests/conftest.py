import pytest
import torch

# Triton's kernels (kernels/triton_attention.py) run in its interpreter where no GPU is
if not torch.cuda.is_available():
    from verispec.kernels import triton_attention

    triton_attention.use_interpreter()


@pytest.fixture(autouse=True)
def _one_thread_for_small_models(request):
    """Tiny models run on one thread: on a 2-vCPU machine each multi-threaded small op can wait milliseconds
    for the second thread to wake (measured here: 1.8 ms ops took 8 ms), which made these tests 10-20x slower.
    Real-model tests keep the default thread count."""
    torch.manual_seed(0)
    if request.node.get_closest_marker("real") is not None:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_thread():
    """This process computes with one thread for a whole module: a server process beside it, or tiny models,
    need no more."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def tiny(one_thread) -> tuple:
    """The tiny random target and draft (verispec.testing), fresh for each test."""
    from verispec.testing import tiny_pair

    return tiny_pair()


@pytest.fixture(scope="session")
def architecture(tmp_path_factory):
    """architecture(name) -> (a Hugging Face folder of that tiny model, transformers' logits of tokens()), made once
    per session (architectures.py)."""
    made = {}

    def get(name: str):
        if name not in made:
            from architectures import make_model, reference_logits, save, tokens

            model = make_model(name)
            made[name] = (save(model, tmp_path_factory.mktemp(name)), reference_logits(model, tokens()))
        return made[name]

    return get
