"""streams-runtime: Kafka stream processing in the shared-client threading model.

The public API: build a topology with `StreamsBuilder` (DSL) or `Processor`
(Processor API), run it with `App`. Names here are a stable contract.
"""

from runtime.app import (
    REPLACE_THREAD,
    SHUTDOWN_APPLICATION,
    SHUTDOWN_CLIENT,
    App,
    AppState,
    ExceptionHandlerResponse,
    IllegalStateError,
)
from runtime.config import ConfigError, StreamsConfig, load_config
from runtime.kafka.topics import TopicError
from runtime.partitioning.first_seen import FirstSeenPartitioner
from runtime.partitioning.static import VirtualPartitioner
from runtime.processing.store_queries import StoreUnavailableError
from runtime.topology import (
    BranchedKStream,
    JoinWindows,
    KGroupedStream,
    KStream,
    KTable,
    Processor,
    ProcessorContext,
    PunctuationType,
    Record,
    SerializationError,
    StreamsBuilder,
    TimeWindowedKStream,
    TimeWindows,
    Topology,
    TopologyError,
    Windowed,
    serdes,
)
from runtime.topology.global_table import GlobalKTable
from runtime.topology.named_queries import QueryError
from runtime.topology.session_windows import SessionWindows
from runtime.topology.sliding_windows import SlidingWindows
from runtime.topology.suppressed import BufferConfig, EmitStrategy, Suppressed

__all__ = [
    "REPLACE_THREAD",
    "SHUTDOWN_APPLICATION",
    "SHUTDOWN_CLIENT",
    "App",
    "ExceptionHandlerResponse",
    "FirstSeenPartitioner",
    "AppState",
    "BranchedKStream",
    "ConfigError",
    "IllegalStateError",
    "KGroupedStream",
    "KStream",
    "KTable",
    "GlobalKTable",
    "JoinWindows",
    "TimeWindowedKStream",
    "TimeWindows",
    "Windowed",
    "Processor",
    "ProcessorContext",
    "PunctuationType",
    "QueryError",
    "Record",
    "SerializationError",
    "StoreUnavailableError",
    "StreamsBuilder",
    "StreamsConfig",
    "TopicError",
    "Topology",
    "TopologyError",
    "VirtualPartitioner",
    "load_config",
    "serdes",
    "BufferConfig",
    "EmitStrategy",
    "SessionWindows",
    "SlidingWindows",
    "Suppressed",
]
