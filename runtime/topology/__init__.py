"""Topologies: the DSL builder, the Processor API, the processor graph, serdes.

Owns how a stream-processing application is described (`StreamsBuilder`,
`KStream`, `KTable`, `KGroupedStream`, `TimeWindows`, `Processor`), how that
description is split into subtopologies (`Topology`, `Subtopology`,
`TopicSpec`) with the state stores each needs (`Subtopology.store_specs`), and
the per-task graph of nodes that processes records (`TaskGraph`, built by
`Subtopology.instantiate`). It talks to
no Kafka client: the task runtime feeds records into a `TaskGraph` and receives
output through the `TaskContext` seam (`runtime.topology.context`).

Threads: builders are used by the thread that defines the app; a built
`Topology` is immutable and readable from any thread; a `TaskGraph` is only
called by the processing thread holding its task's lock.
"""

from runtime.topology import serdes
from runtime.topology.builder import StreamsBuilder
from runtime.topology.context import PunctuationType
from runtime.topology.errors import SerializationError, TopologyError
from runtime.topology.graph import StateStoreDef
from runtime.topology.grouped import KGroupedStream, TimeWindowedKStream
from runtime.topology.kstream import BranchedKStream, KStream
from runtime.topology.ktable import KTable
from runtime.topology.processor import Processor, ProcessorContext
from runtime.topology.record import Record
from runtime.topology.session_windows import SessionWindows
from runtime.topology.sliding_windows import SlidingWindows
from runtime.topology.suppressed import BufferConfig, EmitStrategy, Suppressed
from runtime.topology.topology import Subtopology, TaskGraph, TopicSpec, Topology
from runtime.topology.windows import JoinWindows, TimeWindows, Windowed

__all__ = [
    "BranchedKStream",
    "KGroupedStream",
    "KStream",
    "KTable",
    "Processor",
    "ProcessorContext",
    "PunctuationType",
    "Record",
    "StateStoreDef",
    "StreamsBuilder",
    "Subtopology",
    "TaskGraph",
    "TimeWindowedKStream",
    "JoinWindows",
    "TimeWindows",
    "TopicSpec",
    "Topology",
    "SerializationError",
    "TopologyError",
    "Windowed",
    "serdes",
    "BufferConfig",
    "EmitStrategy",
    "SessionWindows",
    "SlidingWindows",
    "Suppressed",
]
