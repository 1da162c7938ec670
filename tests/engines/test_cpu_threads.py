"""``prepare_compute_thread``: a thread that calls it, and the OpenMP pool it starts afterwards,
read and write denormal floats as zero; a thread that does not keeps them (the control that
shows the check can fail). Each check runs on a fresh thread whose inherited setting is first
turned off: the setting is per thread, and a new thread copies its creator's."""

from __future__ import annotations

import threading

import torch

from loongsage.engines.cpu_threads import denormals_kept, prepare_compute_thread

ELEMENTS = 1 << 20  # big enough for every pool thread to take a share


def surviving_denormals(prepare: bool, threads: int) -> int:
    """Nonzero elements of a large denormal tensor scaled by one, computed on a fresh thread."""
    out: list[int] = []

    def work() -> None:
        torch.set_flush_denormal(False)
        if prepare:
            prepare_compute_thread(threads)
        else:
            torch.set_num_threads(threads)
        out.append(denormals_kept(ELEMENTS))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return out[0]


def test_a_prepared_thread_and_its_pool_flush_denormals():
    before = torch.get_num_threads()
    try:
        assert surviving_denormals(prepare=False, threads=2) == ELEMENTS
        assert surviving_denormals(prepare=True, threads=2) == 0
        assert surviving_denormals(prepare=True, threads=1) == 0
    finally:
        torch.set_num_threads(before)


def test_an_in_process_train_engine_leaves_the_callers_thread_alone(tiny_model_dir):
    """Built on the caller's thread, the train engine does not make it flush: the caller's own
    code sees the setting (hypothesis refuses to draw floats on a flushing thread)."""
    from loongsage.engines.embedded_train import EmbeddedTrainEngine
    from loongsage.schema import ModelConfig, TrainConfig

    out: list[int] = []

    def build() -> None:
        torch.set_flush_denormal(False)
        EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(micro_batch_size=2))
        out.append(denormals_kept(ELEMENTS))

    thread = threading.Thread(target=build)
    thread.start()
    thread.join()
    assert out == [ELEMENTS]
