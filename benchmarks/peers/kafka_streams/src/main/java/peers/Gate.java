package peers;

import java.lang.reflect.InvocationHandler;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.time.Duration;
import java.util.Collection;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.LongAdder;
import org.apache.kafka.clients.consumer.Consumer;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.streams.processor.internals.DefaultKafkaClientSupplier;

/**
 * Holds the input of the measured instance until the harness says {@code go}, and counts records.
 *
 * <p>The gate sits in the main consumers ({@link #clientSupplier()} wraps each one): while it is
 * closed every assigned input partition stays paused in the real consumer, so the group is
 * joined, tasks are created and stateful tasks restore (the application reaches RUNNING) but no
 * input record is fetched. The stream thread opens it at its first {@code poll} after
 * {@link #open()} by resuming every partition Kafka Streams itself has not paused.
 *
 * <p>Why not {@code KafkaStreams.pause()}: pausing a topology also pauses the restoration of its
 * tasks, and a gate that blocks a classic stream thread inside processing stops that thread from
 * taking its other restored tasks into RUNNING; both measured restoration or deadlocked. Why not
 * buffer before {@code go} as the runtime does: there is no way to fetch without handing records
 * to the tasks; after {@code go} the first fetch costs one round trip to the broker.
 *
 * <p>{@link #pass} is the {@code peek} after each topology's source: it only counts (a
 * {@link LongAdder}: the harness's "processed" figure; Kafka Streams' own per-task counters need
 * DEBUG metrics, which cost more).
 */
final class Gate {
    /** How long a consumer polls per call while the gate is closed, so it opens promptly. */
    private static final Duration CLOSED_POLL = Duration.ofMillis(5);

    private final LongAdder processed = new LongAdder();
    private volatile boolean open;

    /** Called by the processing threads for every record after the source. */
    void pass() {
        processed.increment();
    }

    /** Any thread: the stream threads resume their input at their next poll. */
    void open() {
        open = true;
    }

    boolean isOpen() {
        return open;
    }

    long processed() {
        return processed.sum();
    }

    /** Kafka Streams' client supplier with this gate in every main consumer. */
    DefaultKafkaClientSupplier clientSupplier() {
        final Gate gate = this;
        return new DefaultKafkaClientSupplier() {
            @Override
            public Consumer<byte[], byte[]> getConsumer(final Map<String, Object> config) {
                return gate.wrap(super.getConsumer(config));
            }
        };
    }

    @SuppressWarnings("unchecked")
    private Consumer<byte[], byte[]> wrap(final Consumer<byte[], byte[]> consumer) {
        return (Consumer<byte[], byte[]>) Proxy.newProxyInstance(
                Consumer.class.getClassLoader(), new Class<?>[] {Consumer.class}, new GatedConsumer(consumer));
    }

    /**
     * Forwards every call to the real consumer, except that while the gate is closed the
     * partitions stay paused. Only the consumer's own (stream) thread calls it, as for any
     * consumer, so its fields need no locking.
     */
    private final class GatedConsumer implements InvocationHandler {
        private final Consumer<byte[], byte[]> delegate;
        // What Kafka Streams has paused itself (full buffers, restoring tasks): its view of
        // paused(), and what must stay paused when the gate opens.
        private final Set<TopicPartition> pausedByStreams = new HashSet<>();
        private boolean opened;

        GatedConsumer(final Consumer<byte[], byte[]> delegate) {
            this.delegate = delegate;
        }

        @Override
        @SuppressWarnings("unchecked")
        public Object invoke(final Object proxy, final Method method, final Object[] args) throws Throwable {
            switch (method.getName()) {
                case "poll" -> {
                    if (!opened) {
                        if (open) {
                            opened = true;
                            final Set<TopicPartition> resume = new HashSet<>(delegate.assignment());
                            resume.removeAll(pausedByStreams);
                            delegate.resume(resume);
                        } else {
                            delegate.pause(delegate.assignment());
                            if (args != null && args.length == 1 && args[0] instanceof Duration timeout
                                    && timeout.compareTo(CLOSED_POLL) > 0) {
                                return delegate.poll(CLOSED_POLL);
                            }
                        }
                    }
                }
                case "pause" -> pausedByStreams.addAll((Collection<TopicPartition>) args[0]);
                case "resume" -> {
                    pausedByStreams.removeAll((Collection<TopicPartition>) args[0]);
                    if (!opened) {
                        return null;
                    }
                }
                case "paused" -> {
                    if (!opened) {
                        final Set<TopicPartition> paused = new HashSet<>(pausedByStreams);
                        paused.retainAll(delegate.assignment());
                        return paused;
                    }
                }
                case "subscribe" -> {
                    if (args != null && args.length == 2 && args[1] instanceof ConsumerRebalanceListener listener) {
                        args[1] = gatedListener(listener);
                    }
                }
                default -> { }
            }
            try {
                return method.invoke(delegate, args);
            } catch (final InvocationTargetException e) {
                throw e.getCause();
            }
        }

        /** Newly assigned partitions are paused inside the poll that assigns them. */
        private ConsumerRebalanceListener gatedListener(final ConsumerRebalanceListener listener) {
            return new ConsumerRebalanceListener() {
                @Override
                public void onPartitionsAssigned(final Collection<TopicPartition> partitions) {
                    listener.onPartitionsAssigned(partitions);
                    if (!opened) {
                        delegate.pause(partitions);
                    }
                }

                @Override
                public void onPartitionsRevoked(final Collection<TopicPartition> partitions) {
                    pausedByStreams.removeAll(partitions);
                    listener.onPartitionsRevoked(partitions);
                }

                @Override
                public void onPartitionsLost(final Collection<TopicPartition> partitions) {
                    pausedByStreams.removeAll(partitions);
                    listener.onPartitionsLost(partitions);
                }
            };
        }
    }
}
