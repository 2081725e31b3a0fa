"""DeepSpeed sleep on the GPU: optimizer states and fp32 masters leave the GPU into persistent pinned buffers,
and a sleep/wake round trip does not change the next training step."""
from __future__ import annotations

import pytest
from gpu_helpers import fixed_sequence
from test_weight_sync_gpu import sft_loss

pytestmark = pytest.mark.gpu


def two_steps(trainer, sleep_between: bool) -> float:
    import torch

    prompt, response = fixed_sequence(16, 200), fixed_sequence(128, 201)
    if sleep_between:  # as the actor worker does at start: asleep before the first step (no Adam moments yet)
        trainer.sleep()
    trainer.wake_up()
    trainer.train_micro_batch(sft_loss(prompt, response), is_boundary=True)
    if sleep_between:
        trainer.sleep()
        trainer.wake_up()
    with torch.no_grad():
        loss, _ = sft_loss(prompt, response)(trainer.engine)
    return float(loss)


def trained_once(make_trainer, seed: int):
    """A fresh trainer after one optimizer step on a fixed sequence (Adam's moments exist now), and the sequence."""
    trainer = make_trainer(lr=1e-4)
    prompt, response = fixed_sequence(16, seed), fixed_sequence(128, seed + 1)
    trainer.wake_up()
    trainer.train_micro_batch(sft_loss(prompt, response), is_boundary=True)
    return trainer, prompt, response


def loss_after_next_step(trainer, prompt, response) -> float:
    """Wake the trainer (a no-op when awake), run one optimizer step on the sequence, then its loss."""
    import torch

    trainer.wake_up()
    trainer.train_micro_batch(sft_loss(prompt, response), is_boundary=True)
    with torch.no_grad():
        loss, _ = sft_loss(prompt, response)(trainer.engine)
    return float(loss)


def test_sleep_round_trip_leaves_the_next_step_unchanged(make_trainer):
    plain = two_steps(make_trainer(lr=1e-4), sleep_between=False)
    slept = two_steps(make_trainer(lr=1e-4), sleep_between=True)
    assert abs(slept - plain) <= 1e-3 * abs(plain), (slept, plain)


def test_sleep_frees_the_optimizer_states_and_uses_the_preallocated_buffer(make_trainer, cuda):
    torch = cuda
    trainer = make_trainer(lr=1e-4)
    mover = trainer.state_mover
    assert mover is not None, "ZeRO-2 on a GPU must use the pinned-buffer mover"
    numel = sum(p.numel() for p in trainer.module.parameters())
    assert trainer.sleep() >= 4 * numel  # before the first step Adam has no moments yet: the fp32 masters only
    trainer.wake_up()
    trainer.train_micro_batch(sft_loss(fixed_sequence(16, 300), fixed_sequence(64, 301)), is_boundary=True)
    torch.cuda.synchronize()
    free_awake = torch.cuda.mem_get_info()[0]
    moved = trainer.sleep()
    torch.cuda.synchronize()
    freed = torch.cuda.mem_get_info()[0] - free_awake
    assert moved >= 12 * numel  # fp32 master + two Adam moments per parameter
    assert freed >= 0.9 * 12 * numel, (freed / 2**30, 12 * numel / 2**30)
    host = mover.host.get()
    assert host.is_pinned() and moved <= host.numel()
    assert trainer.wake_up() == moved and trainer.sleep() == moved  # the layout is stable across round trips


def test_a_wake_started_ahead_gives_the_same_next_step(make_trainer, cuda):
    """`wake_up_soon` (the advantage stage starts the states' copy back early) then `wake_up` is the plain round trip:
    the same bytes moved and, bit for bit, the same loss after the next step."""
    torch = cuda

    def after_round_trip(ahead: bool) -> tuple[int, float]:
        trainer, prompt, response = trained_once(make_trainer, seed=400)
        trainer.sleep()
        if ahead:
            trainer.wake_up_soon()
            torch.cuda.synchronize()
        moved = trainer.wake_up()
        return moved, loss_after_next_step(trainer, prompt, response)

    assert after_round_trip(ahead=True) == after_round_trip(ahead=False)


def test_a_sleep_finished_later_frees_its_memory_then_and_gives_the_same_next_step(make_trainer, cuda):
    """`sleep_soon` (the actor's train stage) copies on a side stream while other GPU work runs and keeps the states
    on the GPU until `finish_sleep` (the sync's end), which leaves it running while the GPU has the asked-for share
    free: then the same bytes are freed as by `sleep`, and after a wake the next step's loss is the plain round
    trip's, bit for bit."""
    torch = cuda

    def after_round_trip(deferred: bool) -> tuple[int, float]:
        trainer, prompt, response = trained_once(make_trainer, seed=500)
        torch.cuda.synchronize()
        if not deferred:
            moved = trainer.sleep()
        else:
            trainer.sleep_soon()
            busy = torch.full((4096, 4096), 0.5, device="cuda")
            for _ in range(8):  # the sync's work on the default stream, beside the copy
                busy = busy @ busy / 64
            torch.cuda.synchronize()
            free_copying = torch.cuda.mem_get_info()[0]
            assert trainer.state_mover.is_copying and not trainer.state_mover.asleep
            assert trainer.finish_sleep(unless_free_share=0.0) == 0.0  # room for the engine: the copy runs on
            assert trainer.state_mover.is_copying and torch.cuda.mem_get_info()[0] == free_copying
            trainer.finish_sleep(unless_free_share=1.0)  # never that much room: it finishes
            moved = trainer.state_mover.last_bytes
            freed = torch.cuda.mem_get_info()[0] - free_copying
            assert freed >= 0.9 * moved, (freed / 2**30, moved / 2**30)  # freed at the finish, not before
            assert trainer.finish_sleep() == 0.0  # nothing left under way
        return moved, loss_after_next_step(trainer, prompt, response)

    assert after_round_trip(deferred=True) == after_round_trip(deferred=False)


def test_a_wake_while_the_sleep_copies_finishes_it_first(make_trainer, cuda):
    """A wake (or a second sleep) that comes while `sleep_soon`'s copy runs waits for it: the states end on the GPU
    and the step after is the plain round trip's."""
    def after(wake_early: bool) -> float:
        trainer, prompt, response = trained_once(make_trainer, seed=600)
        if wake_early:
            trainer.sleep_soon()
            trainer.wake_up_soon()  # finishes the copy, then starts the copy back
        else:
            trainer.sleep()
        trainer.wake_up()
        assert not trainer.state_mover.is_copying and not trainer.state_mover.asleep
        return loss_after_next_step(trainer, prompt, response)

    assert after(wake_early=True) == after(wake_early=False)
