"""`StatusTopicReader`: the status topic read on the restoration thread's loop.

The design gives the process three Kafka clients, so the compacted
`<application.id>-status` topic costs none of its own: its one partition is
read by the restore consumer. The restoration thread only routes the topic's
messages here (`runtime.state.restoration_seams.SideReader`) and knows
nothing of their meaning. This reader assigns the partition from its
beginning, hands each record to the `StatusTopicView` and each position (the
next offset, or the end a fetch reported) to its `advance`, and reads the
topic again from its start when its position is out of range (the topic was
deleted and recreated). The view publishes one immutable `StatusSnapshot`
(`runtime.placement.status_view`): that snapshot is the only hand-over
between the restoration thread and the polling thread for the status topic.

Threads: restoration thread only (`start`, `take`, called by its loop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from runtime.logging import get_logger

if TYPE_CHECKING:
    from runtime.placement.status_view import StatusTopicView

log = get_logger("runtime.restoration")


class StatusTopicReader:
    """Partition 0 of the status topic into a `StatusTopicView`. See the
    module docstring."""

    def __init__(self, topic: str, view: StatusTopicView) -> None:
        self._topic = topic
        self._view = view

    @property
    def topics(self) -> frozenset[str]:
        return frozenset((self._topic,))

    def start(self, consumer: Consumer) -> None:
        """The whole topic, from its beginning (it is compacted)."""
        consumer.incremental_assign([TopicPartition(self._topic, 0, OFFSET_BEGINNING)])

    def take(self, consumer: Consumer, messages: list[Any]) -> None:
        """One batch's messages of the topic, in order: each record decoded
        into the view, then the position moved past it; then a position out
        of range restarts the topic from its start (and an end reported in
        the same batch is of the old position, so not taken); else an end
        moves the position to it."""
        view = self._view
        ends: list[int] = []
        out_of_range: int | None = None
        for message in messages:
            error = message.error()
            if error is None:
                view.apply(message.key(), message.value())
                offset = message.offset()
                if offset is not None:
                    view.advance(offset + 1)
            elif error.code() == KafkaError._PARTITION_EOF:
                ends.append(message.offset())
            elif error.code() == KafkaError._AUTO_OFFSET_RESET:
                out_of_range = message.offset()
        if out_of_range is not None:
            log.warning(
                "status_topic_position_out_of_range", topic=self._topic, position=out_of_range
            )
            consumer.incremental_unassign([TopicPartition(self._topic, 0)])
            consumer.incremental_assign([TopicPartition(self._topic, 0, OFFSET_BEGINNING)])
            return
        for end in ends:
            view.advance(end)
