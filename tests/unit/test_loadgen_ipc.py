"""The messages between the main process and the workers: what is sent is what arrives, and
each side refuses a message meant for the other."""

from __future__ import annotations

from array import array

import msgspec
import pytest

from connector_tax.contract.summary import Priority
from connector_tax.loadgen import ipc


def test_a_fire_arrives_whole_with_its_trace_blocks() -> None:
    spec = ipc.RequestSpec(7, "c-7", 512, 64, ((3, 512), (9, 256)), "p_c#1", "11-7")
    got = ipc.to_worker(ipc.pack(ipc.Fire(spec, 123_456_789_012)))
    assert type(got) is ipc.Fire
    assert got.spec == spec and got.t_scheduled_ns == 123_456_789_012
    assert got.spec.blocks == ((3, 512), (9, 256))  # tuples, as the body builder expects


def test_a_result_arrives_whole() -> None:
    gaps = array("I", [1000, 0, 4_294_967_295]).tobytes()
    result = ipc.RequestResult(3, 1, 10, 20, 30, 8, 2, 2, 200, "ok", None, gaps, "p_c#1", "c-3", None)
    got = ipc.to_main(ipc.pack(ipc.Result(result)))
    assert type(got) is ipc.Result and got.result == result
    assert array("I", got.result.itl_us).tolist() == [1000, 0, 4_294_967_295]


@pytest.mark.parametrize(
    "message",
    [ipc.CancelAll("drain timeout after 3 s"), ipc.SetCell(None), ipc.SetCell("/tmp/x.jsonl"), ipc.Stop()],
)
def test_every_message_to_a_worker_round_trips(message: ipc.ToWorker) -> None:
    assert ipc.to_worker(ipc.pack(message)) == message


@pytest.mark.parametrize(
    "message",
    [ipc.Ready(0, 4242, Priority(5, False, "no root")), ipc.CellSet(1), ipc.Bye(2)],
)
def test_every_message_to_the_main_process_round_trips(message: ipc.ToMain) -> None:
    assert ipc.to_main(ipc.pack(message)) == message


def test_a_message_meant_for_the_other_side_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError):
        ipc.to_worker(ipc.pack(ipc.Bye(0)))
    with pytest.raises(msgspec.ValidationError):
        ipc.to_main(ipc.pack(ipc.Stop()))
