"""Which partition a record goes to, and how partition counts grow.

The default partitioner (the Java client's murmur2, through librdkafka), the
static partitioner contract (`static.partitioner`) with its claims, the
first-seen partitioner (a key keeps the partition it was first seen on
across an expansion), and the pure planning of a partition expansion
(`expansion_plan`) with its once-per-expansion marker.

Threads: partitioners are called by processing threads (sink nodes) and the
polling thread; they are stateless or lock their own state. The planners are
pure. Nothing here owns a Kafka client except `first_seen`'s table reader
and the marker's admin calls, each used by the thread that made it.
"""
