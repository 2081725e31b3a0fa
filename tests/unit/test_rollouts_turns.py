"""`hybrid rollouts`: an agent's rollout row is followed by its episode, turn by turn."""
from flows.rollouts_cli import _turn_lines


def test_an_episode_is_shown_turn_by_turn():
    turns = [{"action": [0, 3], "action_text": "abc", "feedback": [3, 5], "feedback_text": " hi", "reward": 0.5,
              "score": 0.25, "done": False, "feedback_truncated": False, "extra_logs": {}},
             {"action": [5, 6], "action_text": "d", "feedback": [6, 7], "feedback_text": " higher", "reward": 1.0,
              "score": 1.0, "done": True, "feedback_truncated": True, "extra_logs": {}}]
    assert _turn_lines(turns) == [
        "turn 1: action [0, 3) 'abc' → reward 0.5000 score 0.2500",
        "        feedback [3, 5) ' hi'",
        "turn 2: action [5, 6) 'd' → reward 1.0000 score 1.0000 done",
        "        feedback [6, 7) ' higher' (cut at max_len)",
    ]
    assert _turn_lines([]) == []
