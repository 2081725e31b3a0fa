"""The oversampling prompt ledger's rules, by hand: the consume/carry/expire schedule of a step's groups (with and
without dynamic filtering, a carried group out of the version range), drawing prompts with none in flight twice,
returned prompts served first, and the ledger's rows."""
from hybrid_core.data.prompt_ledger import (GroupSchedule, SamplerState, Served, carried_use, draw, ledger_rows,
                                            returned, take_groups)

# 5 rows; episode 0 serves them as 3 1 4 0 2, episode 1 as 2 0 4 1 3, episode 2 as episode 0
ORDERS = {0: [3, 1, 4, 0, 2], 1: [2, 0, 4, 1, 3], 2: [3, 1, 4, 0, 2]}


def stream_entry(position: int) -> tuple[int, int]:
    return position // 5, ORDERS[position // 5][position % 5]


def test_a_step_trains_the_carried_groups_first_then_the_batch_in_order():
    step_4 = range(1, 4)  # Q 2: step 4 may consume versions 1, 2 and 3
    # B 4, 2 groups carried, batch 4 passes all its 6 (no filtering): 2 carried + 2 fresh, 4 left over
    assert take_groups([2, 2], 6, 4, step_4) == GroupSchedule(used=[0, 1], expired=[], fresh=[0, 1],
                                                              surplus=[2, 3, 4, 5])
    # 6 carried: the first 4 fill the step, 2 expire, and all 6 of batch 4 are its surplus
    assert take_groups([2] * 6, 6, 4, step_4) == GroupSchedule(used=[0, 1, 2, 3], expired=[4, 5], fresh=[],
                                                               surplus=[0, 1, 2, 3, 4, 5])
    # a carried group of version 0 is out of step 4's range: it expires although the step has room
    assert take_groups([0, 2, 2], 3, 4, step_4) == GroupSchedule(used=[1, 2], expired=[0], fresh=[0, 1],
                                                                 surplus=[2])
    # used and expired are known before the batch is generated
    assert carried_use([0, 2, 2], 4, step_4) == ([1, 2], [0])


def test_with_filtering_dropped_groups_do_not_count():
    # B 4, 2 carried; filtering passed 3 of batch 4's 6 prompts (the passing ones, in order, are positions 0 1 2):
    # 2 carried + the first 2 passing, 1 passing group left over
    assert take_groups([3, 3], 3, 4, range(1, 4)) == GroupSchedule(used=[0, 1], expired=[], fresh=[0, 1], surplus=[2])
    # only 1 passed: the step is short of 1 group (the batch then draws the shortfall and generates again)
    assert take_groups([3, 3], 1, 4, range(1, 4)) == GroupSchedule(used=[0, 1], expired=[], fresh=[0], surplus=[])


def test_draws_serve_the_waiting_prompts_first_and_never_a_row_in_flight():
    first, state = draw(SamplerState(), 3, stream_entry, 5, busy=set())
    assert first == [(0, 3), (0, 1), (0, 4)] and state == SamplerState(position=3)
    # (0, 1) expired: it is served again first; row 4 is in flight (its group is trained this step)
    second, state = draw(returned(state, [Served(0, 1)]), 3, stream_entry, 5, busy={4})
    assert second == [(0, 1), (0, 0), (0, 2)] and state == SamplerState(position=5)
    # rows 0 and 2 in flight: episode 1's 2 and 0 are passed over and wait, in order
    third, state = draw(state, 3, stream_entry, 5, busy={0, 2})
    assert third == [(1, 4), (1, 1), (1, 3)]
    assert state == SamplerState(position=10, waiting=(Served(1, 2), Served(1, 0)))
    # once free, they come before the stream; a draw never serves one row twice
    fourth, state = draw(state, 2, stream_entry, 5, busy=set())
    assert fourth == [(1, 2), (1, 0)] and state == SamplerState(position=10)
    # every row in flight: nothing is served and nothing is read from the stream
    assert draw(state, 2, stream_entry, 5, busy={0, 1, 2, 3, 4}) == ([], state)
    # one row free: one prompt, the stream read up to it
    assert draw(state, 2, stream_entry, 5, busy={0, 1, 2, 3}) == (
        [(2, 4)], SamplerState(position=13, waiting=(Served(2, 3), Served(2, 1))))


def test_the_sampler_state_round_trips_through_its_record():
    state = SamplerState(position=13, waiting=(Served(2, 3), Served(2, 1)))
    assert state.record() == {"position": 13, "waiting": [[2, 3], [2, 1]]}
    assert SamplerState.from_record(state.record()) == state


def test_the_ledger_says_what_became_of_every_prompt():
    schedule = GroupSchedule(used=[0], expired=[1], fresh=[0, 1], surplus=[2])
    carried = [(Served(0, 7), 3), (Served(0, 9), 3)]
    drawn = [Served(0, 9), Served(0, 2), Served(0, 5), Served(1, 0)]
    rows = ledger_rows(carried, schedule, drawn, [True, False, True, True], batch_step=4)
    assert [(r["epoch"], r["prompt_index"], r["batch_step"], r["fate"]) for r in rows] == [
        (0, 7, 3, "trained"), (0, 9, 3, "expired"),  # carried from batch 3
        (0, 9, 4, "trained"), (0, 2, 4, "filtered"), (0, 5, 4, "trained"), (1, 0, 4, "surplus")]
