package peers;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.io.OutputStream;
import java.io.PrintStream;
import java.io.StringWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.ThreadMetadata;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.RocksDBConfigSetter;
import org.rocksdb.BlockBasedTableConfig;
import org.rocksdb.Cache;
import org.rocksdb.LRUCache;
import org.rocksdb.Options;
import org.rocksdb.WriteBufferManager;

/**
 * The Kafka Streams side of the state benchmark ({@code benchmarks/state/}): one instance, one task
 * per input partition, two RocksDB stores per task (a count and a tumbling-window count).
 *
 * <p>{@code java -cp ks-peer.jar peers.StateBench SPEC_JSON}; the figures go as JSON to
 * {@code spec.result_path}; exit 0 when the run completed. Phases, in one JVM:
 *
 * <ol>
 *   <li>open: start with the input held ({@link Gate}) until RUNNING with every task active
 *       ({@code open_s});
 *   <li>process: open the gate; records/s until the {@code peek} after the source counted the whole
 *       backlog; one more commit; peak RSS (VmHWM) so far;
 *   <li>restore ({@code spec.restore}): close, delete the state directory, start a new instance of
 *       the same application id: every store restores from its changelog ({@code restore_s} until
 *       RUNNING with every task active and every restore ended).
 * </ol>
 *
 * <p>Commit time: Kafka Streams' {@code commit-latency-avg/max} thread metrics are the commit's
 * duration divided by the tasks it committed ({@code StreamThread.runOnce}), so they say little
 * about one commit of 256 tasks. The stream thread logs the whole duration of every commit at
 * DEBUG ("Committed all active tasks ... in N ms"); this class turns that logger to DEBUG, reads
 * those lines from stderr in process and drops every DEBUG line (the log file keeps the rest).
 * The per-task metrics are reported too.
 *
 * <p>Memory ({@code spec.memory}): {@code default} is Kafka Streams' defaults (each store its own
 * block cache and memtables); {@code bounded} is the documented bounded-memory recipe, {@link
 * BoundedMemory}.
 */
public final class StateBench {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final String STREAM_THREAD_LOGGER =
            "org.apache.kafka.streams.processor.internals.StreamThread";
    private static final Pattern COMMITTED = Pattern.compile("Committed all active tasks .* in (\\d+)ms");

    /** Every commit the stream threads logged: {end (nanoTime), milliseconds}. */
    private static final List<long[]> COMMITS = new ArrayList<>();

    private StateBench() {}

    public static void main(final String[] args) throws Exception {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        System.setProperty("org.slf4j.simpleLogger.log." + STREAM_THREAD_LOGGER, "debug");
        System.setProperty("org.slf4j.simpleLogger.showDateTime", "true");
        System.setErr(new PrintStream(new CommitLines(System.err), true, StandardCharsets.UTF_8));
        final JsonNode spec = JSON.readTree(args[args.length - 1]);
        final Map<String, Object> result = new LinkedHashMap<>();
        int exit = 0;
        try {
            run(spec, result);
            result.put("ok", true);
        } catch (final Throwable e) {
            e.printStackTrace();
            result.put("ok", false);
            result.put("error", describe(e));
            exit = 1;
        }
        result.put("peak_rss_mb", vmHwmMb());
        JSON.writeValue(new File(spec.get("result_path").asText()), result);
        System.err.flush();
        // Lingering client threads must not keep the JVM alive: the harness waits for this exit.
        Runtime.getRuntime().halt(exit);
    }

    private static void run(final JsonNode spec, final Map<String, Object> result) throws Exception {
        final int partitions = spec.get("partitions").asInt();
        final long records = spec.get("records").asLong();
        final double timeoutS = spec.path("timeout_s").asDouble(600);
        final Path stateDir = Files.createTempDirectory("bench-state-ks-");
        final Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, spec.get("application_id").asText());
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, spec.get("bootstrap").asText());
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, spec.get("threads").asInt());
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, spec.get("commit_interval_ms").asInt());
        props.put("consumer.session.timeout.ms", 6000);
        final String memory = spec.get("memory").asText();
        switch (memory) {
            case "default" -> { }
            case "bounded" -> {
                props.put(StreamsConfig.ROCKSDB_CONFIG_SETTER_CLASS_CONFIG, BoundedMemory.class);
                props.put(BoundedMemory.MEMORY_BYTES, spec.get("memory_bytes").asLong());
                props.put(BoundedMemory.WRITE_BUFFER_RATIO, spec.get("write_buffer_ratio").asDouble());
            }
            default -> throw new IllegalArgumentException("unknown memory setting " + memory);
        }
        result.put("memory", memory);
        result.put("partitions", partitions);
        try {
            final Gate gate = new Gate();
            final KafkaStreams streams = new KafkaStreams(topology(spec, gate), props, gate.clientSupplier());
            final AtomicReference<Throwable> failure = watch(streams);
            final long started = System.nanoTime();
            streams.start();
            try {
                final long running = waitRunning(streams, failure, partitions, started, timeoutS);
                result.put("open_s", (running - started) / 1e9);
                final long go = System.nanoTime();
                gate.open();
                while (gate.processed() < records) {
                    check(streams, failure, started, timeoutS, "the whole backlog (" + gate.processed() + ")");
                    Thread.sleep(10);
                }
                final long done = System.nanoTime();
                // One commit that started after the last record: the counts are durable.
                while (!committedAfter(done)) {
                    check(streams, failure, started, timeoutS, "the commit after the backlog");
                    Thread.sleep(20);
                }
                result.put("records", records);
                result.put("processed", gate.processed());
                result.put("backlog_s", (done - go) / 1e9);
                result.put("records_per_s", records / ((done - go) / 1e9));
                result.put("records_per_s_from_start", records / ((done - started) / 1e9));
                commitFigures(go, System.nanoTime(), result);
                result.put("per_task_commit_latency_avg_ms", threadMetric(streams, "commit-latency-avg"));
                result.put("per_task_commit_latency_max_ms", threadMetric(streams, "commit-latency-max"));
                result.put("rss_peak_processing_mb", vmHwmMb());
            } finally {
                streams.close(Duration.ofSeconds(60));
            }
            if (spec.path("restore").asBoolean(false)) {
                deleteTree(stateDir);
                restore(spec, props, partitions, timeoutS, result);
            }
        } finally {
            deleteTree(stateDir);
        }
    }

    private static void restore(
            final JsonNode spec,
            final Properties props,
            final int partitions,
            final double timeoutS,
            final Map<String, Object> result) throws Exception {
        final Gate gate = new Gate();
        gate.open();
        final KafkaStreams streams = new KafkaStreams(topology(spec, gate), props);
        final AtomicLong restored = new AtomicLong();
        final AtomicLong lastRestoreEnd = new AtomicLong();
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            @Override
            public void onRestoreStart(final TopicPartition tp, final String store, final long from, final long to) { }

            @Override
            public void onBatchRestored(final TopicPartition tp, final String store, final long end, final long n) {
                restored.addAndGet(n);
            }

            @Override
            public void onRestoreEnd(final TopicPartition tp, final String store, final long total) {
                lastRestoreEnd.set(System.nanoTime());
            }
        });
        final AtomicReference<Throwable> failure = watch(streams);
        final long started = System.nanoTime();
        streams.start();
        try {
            final long running = waitRunning(streams, failure, partitions, started, timeoutS);
            result.put("restore_s", (Math.max(running, lastRestoreEnd.get()) - started) / 1e9);
            result.put("restored_records", restored.get());
        } finally {
            streams.close(Duration.ofSeconds(60));
        }
    }

    private static Topology topology(final JsonNode spec, final Gate gate) {
        final StreamsBuilder builder = new StreamsBuilder();
        final KGroupedStream<String, String> grouped = builder
                .stream(spec.get("input_topic").asText(), Consumed.with(Serdes.String(), Serdes.String()))
                .peek((k, v) -> gate.pass())
                .groupByKey();
        grouped.count(Materialized.as("counts"));
        grouped.windowedBy(TimeWindows.ofSizeWithNoGrace(Duration.ofMillis(spec.get("window_ms").asLong())))
                .count(Materialized.as("windowed-counts"));
        return builder.build();
    }

    private static AtomicReference<Throwable> watch(final KafkaStreams streams) {
        final AtomicReference<Throwable> failure = new AtomicReference<>();
        streams.setUncaughtExceptionHandler(e -> {
            failure.compareAndSet(null, e);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        return failure;
    }

    /** Waits until RUNNING with {@code partitions} active tasks; returns when (nanoTime). */
    private static long waitRunning(
            final KafkaStreams streams,
            final AtomicReference<Throwable> failure,
            final int partitions,
            final long started,
            final double timeoutS) throws InterruptedException {
        while (true) {
            check(streams, failure, started, timeoutS, "every task RUNNING");
            if (streams.state() == KafkaStreams.State.RUNNING) {
                int active = 0;
                for (final ThreadMetadata thread : streams.metadataForLocalThreads()) {
                    active += thread.activeTasks().size();
                }
                if (active == partitions) {
                    return System.nanoTime();
                }
            }
            Thread.sleep(20);
        }
    }

    private static void check(
            final KafkaStreams streams,
            final AtomicReference<Throwable> failure,
            final long started,
            final double timeoutS,
            final String what) {
        final Throwable e = failure.get();
        if (e != null) {
            throw new IllegalStateException("Kafka Streams failed: " + describe(e), e);
        }
        final KafkaStreams.State state = streams.state();
        if (state == KafkaStreams.State.ERROR
                || state == KafkaStreams.State.NOT_RUNNING
                || state == KafkaStreams.State.PENDING_ERROR) {
            throw new IllegalStateException("Kafka Streams is " + state + " while waiting for " + what);
        }
        if ((System.nanoTime() - started) / 1e9 > timeoutS) {
            throw new IllegalStateException(String.format("%s: not within %.0f s", what, timeoutS));
        }
    }

    private static boolean committedAfter(final long t) {
        synchronized (COMMITS) {
            for (final long[] c : COMMITS) {
                if (c[0] - c[1] * 1_000_000L >= t) {
                    return true;
                }
            }
        }
        return false;
    }

    private static void commitFigures(final long from, final long to, final Map<String, Object> result) {
        final List<Long> ms = new ArrayList<>();
        synchronized (COMMITS) {
            for (final long[] c : COMMITS) {
                if (c[0] >= from && c[0] <= to) {
                    ms.add(c[1]);
                }
            }
        }
        ms.sort(null);
        result.put("commits", ms.size());
        if (ms.isEmpty()) {
            return;
        }
        result.put("commit_median_ms", ms.size() % 2 == 1
                ? (double) ms.get(ms.size() / 2)
                : (ms.get(ms.size() / 2 - 1) + ms.get(ms.size() / 2)) / 2.0);
        final int rank = Math.min(ms.size(), Math.max(1, (int) Math.ceil(0.99 * ms.size())));
        result.put("commit_p99_ms", (double) ms.get(rank - 1));
        result.put("commit_max_ms", (double) ms.get(ms.size() - 1));
    }

    private static Double threadMetric(final KafkaStreams streams, final String name) {
        double max = Double.NaN;
        for (final Map.Entry<MetricName, ? extends Metric> e : streams.metrics().entrySet()) {
            if (e.getKey().name().equals(name) && e.getKey().group().equals("stream-thread-metrics")) {
                final Object value = e.getValue().metricValue();
                if (value instanceof Double d && !d.isNaN() && !d.isInfinite()) {
                    max = Double.isNaN(max) ? d : Math.max(max, d);
                }
            }
        }
        return Double.isNaN(max) ? null : max;
    }

    private static double vmHwmMb() {
        try {
            for (final String line : Files.readAllLines(Path.of("/proc/self/status"))) {
                if (line.startsWith("VmHWM:")) {
                    return Long.parseLong(line.replaceAll("[^0-9]", "")) / 1024.0;
                }
            }
        } catch (final IOException ignored) {
            // not Linux: no figure
        }
        return Double.NaN;
    }

    private static String describe(final Throwable e) {
        final StringWriter out = new StringWriter();
        Throwable cause = e;
        while (cause != null) {
            out.write(cause.getClass().getSimpleName() + ": " + cause.getMessage() + "; ");
            cause = cause.getCause();
        }
        return out.toString();
    }

    private static void deleteTree(final Path root) {
        if (!Files.exists(root)) {
            return;
        }
        try (Stream<Path> paths = Files.walk(root)) {
            paths.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
        } catch (final IOException ignored) {
            // a temp directory: best effort
        }
    }

    /**
     * stderr, line by line: the stream threads' commit lines are recorded in {@link #COMMITS}, every
     * DEBUG line is dropped (the StreamThread logger is at DEBUG only for those), the rest passes.
     */
    static final class CommitLines extends OutputStream {
        private final PrintStream out;
        private final ByteArrayOutputStream line = new ByteArrayOutputStream();

        CommitLines(final PrintStream out) {
            this.out = out;
        }

        @Override
        public synchronized void write(final int b) {
            if (b == '\n') {
                flushLine();
            } else {
                line.write(b);
            }
        }

        @Override
        public synchronized void write(final byte[] b, final int off, final int len) {
            for (int i = off; i < off + len; i++) {
                write(b[i]);
            }
        }

        private void flushLine() {
            final String text = line.toString(StandardCharsets.UTF_8);
            line.reset();
            if (text.contains(" DEBUG ")) {
                final Matcher m = COMMITTED.matcher(text);
                if (m.find()) {
                    synchronized (COMMITS) {
                        COMMITS.add(new long[] {System.nanoTime(), Long.parseLong(m.group(1))});
                    }
                }
                return;
            }
            out.println(text);
        }

        @Override
        public synchronized void flush() {
            out.flush();
        }
    }

    /**
     * Kafka Streams' documented bounded-memory recipe ("Memory management", RocksDB): one LRU block
     * cache and one WriteBufferManager charged to it, shared by every store of the process; index
     * and filter blocks in the cache (high priority), the top-level index pinned. Budget and memtable
     * share from the config ({@link #MEMORY_BYTES}, {@link #WRITE_BUFFER_RATIO}), the runtime's
     * {@code state.rocksdb.memory.bytes} and {@code state.rocksdb.write.buffer.ratio}.
     */
    public static final class BoundedMemory implements RocksDBConfigSetter {
        static final String MEMORY_BYTES = "bench.rocksdb.memory.bytes";
        static final String WRITE_BUFFER_RATIO = "bench.rocksdb.write.buffer.ratio";
        private static Cache cache;
        private static WriteBufferManager writeBufferManager;

        private static synchronized void init(final Map<String, Object> configs) {
            if (cache != null) {
                return;
            }
            final long total = Long.parseLong(String.valueOf(configs.get(MEMORY_BYTES)));
            final double ratio = Double.parseDouble(String.valueOf(configs.get(WRITE_BUFFER_RATIO)));
            final long memtables = (long) (total * ratio);
            // -1: default shard bits; false: no strict limit; 0.1: the high-priority share for
            // index and filter blocks (the recipe's INDEX_FILTER_BLOCK_RATIO).
            cache = new LRUCache(total, -1, false, 0.1);
            writeBufferManager = new WriteBufferManager(memtables, cache);
        }

        @Override
        public void setConfig(final String storeName, final Options options, final Map<String, Object> configs) {
            init(configs);
            final BlockBasedTableConfig table = (BlockBasedTableConfig) options.tableFormatConfig();
            table.setBlockCache(cache);
            table.setCacheIndexAndFilterBlocks(true);
            table.setCacheIndexAndFilterBlocksWithHighPriority(true);
            table.setPinTopLevelIndexAndFilter(true);
            options.setWriteBufferManager(writeBufferManager);
            options.setTableFormatConfig(table);
        }

        @Override
        public void close(final String storeName, final Options options) {
            // The cache and the manager are shared by every store: never closed here.
        }
    }
}
