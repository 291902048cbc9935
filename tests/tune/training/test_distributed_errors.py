"""errors_on_all_ranks (tune/training/_distributed.py): an error of a block on one rank is raised on every rank, with
2 processes on CPU (gloo), so that a write rank 0 alone makes (a metric log, the gathered model) stops all ranks."""

import pickle

import pytest
import torch
import torch.multiprocessing as mp

from tune.training import errors_on_all_ranks, init_distributed
from tune.training.checkpointing import CheckpointSaveError
from tune.training.metric_logging import MetricLoggerError
from tune.utils import TuneError

WORLD = 2


class StepError(TuneError):
    """A TuneError whose __init__ takes other arguments than its message: it does not survive pickling."""

    def __init__(self, step: int) -> None:
        super().__init__(f"nothing to write at step {step}")


def _raise(error: BaseException | None) -> None:
    if error is not None:
        raise error


# per case: what the block raises on rank 0 and on rank 1 (None: it succeeds)
CASES = {
    "success": (None, None),
    "rank_0_fails": (MetricLoggerError("Could not write the metric log log.jsonl: [Errno 27] File too large"), None),
    "rank_1_fails": (None, CheckpointSaveError("Could not save checkpoint step_2: rank 1: File too large")),
    "not_picklable": (StepError(3), None),
    "bug_on_rank_1": (None, ValueError("a bug")),
    "both_fail": (TuneError("rank 0's error"), TuneError("rank 1's error")),
}


def _worker(rank: int, store: str, result_path: str) -> None:
    torch.set_num_threads(1)
    # a file rendezvous: no port to race for with tests running side by side
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    outcomes = {}
    for name, errors in CASES.items():
        try:
            with errors_on_all_ranks():
                _raise(errors[rank])
            outcomes[name] = None
        except Exception as error:
            outcomes[name] = (type(error).__name__, str(error), error is errors[rank])
        # the ranks left the block together: the next collective pairs up
        total = torch.tensor([rank + 1])
        torch.distributed.all_reduce(total)
        assert total.item() == 3, (name, total)
    with open(f"{result_path}.{rank}", "wb") as file:
        pickle.dump(outcomes, file)
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Rank -> case -> ``(error class name, message, raised the block's own exception)``, or None on success."""
    tmp = tmp_path_factory.mktemp("errors_on_all_ranks")
    result_path = str(tmp / "result")
    mp.start_processes(_worker, args=(str(tmp / "store"), result_path), nprocs=WORLD, start_method="spawn")
    results = []
    for rank in range(WORLD):
        with open(f"{result_path}.{rank}", "rb") as file:
            results.append(pickle.load(file))
    return results


def test_a_block_that_succeeds_everywhere_raises_nowhere(outcomes):
    assert outcomes[0]["success"] is None and outcomes[1]["success"] is None


def test_rank_zero_failure_is_raised_on_every_rank_as_the_same_class(outcomes):
    message = "Could not write the metric log log.jsonl: [Errno 27] File too large"
    assert outcomes[0]["rank_0_fails"] == ("MetricLoggerError", message, True)  # its own exception
    assert outcomes[1]["rank_0_fails"] == ("MetricLoggerError", message, False)  # a copy


def test_a_failure_on_another_rank_is_raised_on_rank_zero(outcomes):
    message = "Could not save checkpoint step_2: rank 1: File too large"
    assert outcomes[0]["rank_1_fails"] == ("CheckpointSaveError", message, False)
    assert outcomes[1]["rank_1_fails"] == ("CheckpointSaveError", message, True)


def test_an_error_that_does_not_pickle_arrives_as_a_tune_error_with_its_message(outcomes):
    assert outcomes[0]["not_picklable"] == ("StepError", "nothing to write at step 3", True)
    assert outcomes[1]["not_picklable"] == ("TuneError", "nothing to write at step 3", False)


def test_a_bug_keeps_its_exception_on_its_rank_and_names_it_on_the_others(outcomes):
    assert outcomes[1]["bug_on_rank_1"] == ("ValueError", "a bug", True)
    name, message, _ = outcomes[0]["bug_on_rank_1"]
    assert name == "TuneError" and message.startswith("Rank 1 stopped with ValueError: a bug"), message


def test_a_rank_that_failed_itself_raises_its_own_error(outcomes):
    assert outcomes[0]["both_fail"] == ("TuneError", "rank 0's error", True)
    assert outcomes[1]["both_fail"] == ("TuneError", "rank 1's error", True)


def test_without_a_process_group_the_block_runs_as_it_is():
    assert not torch.distributed.is_initialized()
    error = MetricLoggerError("disk full")
    with pytest.raises(MetricLoggerError) as raised, errors_on_all_ranks():
        raise error
    assert raised.value is error
    with errors_on_all_ranks():
        ran = True
    assert ran


def test_with_one_rank_the_block_runs_without_a_collective(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    init_distributed("gloo")  # a one-process group on a free port
    try:
        monkeypatch.setattr(torch.distributed, "all_gather_object", pytest.fail)  # never reached
        with pytest.raises(ValueError, match="a bug"), errors_on_all_ranks():
            raise ValueError("a bug")
        with errors_on_all_ranks():
            pass
    finally:
        torch.distributed.destroy_process_group()
