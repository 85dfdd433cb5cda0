"""Record collector: buffers task output per outgoing partition.

Processing threads hand over whole batches (`RecordCollector.hand_over`); only
the polling thread drains the buffers into the shared producer. Partitioning
of keyed output follows the Java client's default partitioner (murmur2).
"""

from runtime.collector.collector import OutputRecord, RecordCollector
from runtime.partitioning.default import default_partition

__all__ = ["OutputRecord", "RecordCollector", "default_partition"]
