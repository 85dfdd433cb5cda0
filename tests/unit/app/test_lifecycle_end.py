"""How the app's final state follows from the polling thread's end."""

from __future__ import annotations

from runtime.lifecycle import AppState, Lifecycle


def _running() -> Lifecycle:
    lifecycle = Lifecycle()
    lifecycle.set_state(AppState.REBALANCING)
    lifecycle.set_state(AppState.RUNNING)
    return lifecycle


def test_a_polling_thread_that_ends_on_its_own_ends_the_app_in_error() -> None:
    # Nobody asked for a stop and no error was recorded: whatever ended the
    # thread was lost, which is a failure, not a close.
    lifecycle = _running()
    lifecycle.finish(None, stop_requested=False)
    assert lifecycle.state is AppState.ERROR
    assert lifecycle.failure is not None
    assert "without being asked to" in str(lifecycle.failure)


def test_a_requested_close_still_ends_not_running() -> None:
    lifecycle = _running()
    lifecycle.set_state(AppState.PENDING_SHUTDOWN)
    lifecycle.finish(None, stop_requested=True)
    assert lifecycle.state is AppState.NOT_RUNNING
    assert lifecycle.failure is None


def test_a_stop_the_polling_thread_asked_for_itself_ends_not_running() -> None:
    # A planned departure: the instance handed its tasks over and stops, the
    # app still RUNNING when its polling thread ends.
    lifecycle = _running()
    lifecycle.finish(None, stop_requested=True)
    assert lifecycle.state is AppState.NOT_RUNNING
    assert lifecycle.failure is None


def test_the_recorded_error_is_the_failure() -> None:
    lifecycle = _running()
    error = RuntimeError("the broker refused us")
    lifecycle.finish(error, stop_requested=True)
    assert lifecycle.state is AppState.ERROR
    assert lifecycle.failure is error
