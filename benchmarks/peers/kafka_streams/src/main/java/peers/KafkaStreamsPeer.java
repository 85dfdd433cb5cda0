package peers;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Stream;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.ThreadMetadata;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;

/**
 * One measured run of Kafka Streams in a fresh JVM, driven by the benchmark harness.
 *
 * <p>{@code java -jar ks-peer.jar SPEC_JSON}. The protocol is the one of
 * {@code benchmarks/compare/child.py}: events go as JSON lines to the file descriptor
 * {@code spec.event_fd} (opened through {@code /proc/self/fd}), each with {@code t} = the
 * monotonic clock in seconds ({@code System.nanoTime()} reads CLOCK_MONOTONIC on Linux, the clock
 * of Python's {@code time.monotonic()}); commands come on stdin, one per line: {@code go},
 * {@code stop}.
 *
 * <p>Gating: the measured instance starts with its input held in its main consumers (a
 * {@link Gate}): it joins the group, creates its tasks and restores them, and becomes RUNNING
 * without fetching a record. Once RUNNING with every input partition an active task, the tasks
 * spread over the stream threads as evenly as possible and nothing changed for {@code settle_s},
 * it reports {@code ready}; at {@code go} the gate opens.
 *
 * <p>Warm-up ({@code spec.warmup_records} &gt; 0): before the measured instance starts, a
 * throw-away instance of the same topology runs over the first records of the same input under
 * another application id, so the measured run sees a JIT-compiled JVM (see {@code warmUp}).
 *
 * <p>Modes: {@code classic} ({@code num.stream.threads} = threads, each thread polls and processes
 * its own tasks) and {@code processing-threads} (the same plus the internal
 * {@code __processing.threads.enabled__=true}: each stream thread only polls and commits, and one
 * task-executor thread per stream thread processes; see the README beside the pom).
 */
public final class KafkaStreamsPeer {
    private static final ObjectMapper JSON = new ObjectMapper();

    private KafkaStreamsPeer() {}

    public static void main(final String[] args) throws Exception {
        if (System.getProperty("org.slf4j.simpleLogger.defaultLogLevel") == null) {
            System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        }
        System.setProperty("org.slf4j.simpleLogger.showDateTime", "true");
        if (args.length != 1) {
            System.err.println("usage: java -jar ks-peer.jar SPEC_JSON");
            System.exit(2);
        }
        final JsonNode spec = JSON.readTree(args[0]);
        final Events events = new Events(spec.get("event_fd").asInt());
        try {
            final Map<String, Object> result = run(spec, events);
            events.emit("result", result);
        } catch (final Throwable e) {
            e.printStackTrace();
            events.emit("failed", Map.of("error", e.getClass().getSimpleName() + ": " + e.getMessage()));
            System.err.flush();
            Runtime.getRuntime().halt(1);
        }
        System.err.flush();
        // Lingering client threads must not keep the JVM alive: the harness waits for this exit.
        Runtime.getRuntime().halt(0);
    }

    private static Map<String, Object> run(final JsonNode spec, final Events events) throws Exception {
        final int threads = spec.get("threads").asInt();
        final int partitions = spec.get("partitions").asInt();
        final long backlog = spec.path("backlog").asLong(0);
        final double settleS = spec.path("settle_s").asDouble(0.5);
        final double readyTimeoutS = spec.path("ready_timeout_s").asDouble(120);
        final String mode = spec.get("mode").asText();
        final JsonNode echo = spec.get("echo");
        if (echo != null && echo.isArray()) {
            EchoClient.address = new InetSocketAddress(echo.get(0).asText(), echo.get(1).asInt());
        }
        final Path stateDir = Files.createTempDirectory("bench-peers-ks-state-");

        final Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, spec.get("application_id").asText());
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, spec.get("bootstrap").asText());
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
        switch (mode) {
            case "classic" -> { }
            case "processing-threads" -> props.put("__processing.threads.enabled__", "true");
            default -> throw new IllegalArgumentException("unknown mode " + mode);
        }
        for (final Iterator<Map.Entry<String, JsonNode>> it = spec.path("config").fields(); it.hasNext(); ) {
            final Map.Entry<String, JsonNode> e = it.next();
            props.put(e.getKey(), e.getValue().asText());
        }

        final Commands commands = new Commands();
        commands.start();
        final long warmupRecords = Math.min(spec.path("warmup_records").asLong(0), backlog);
        final Map<String, Object> warmup = warmupRecords > 0
                ? warmUp(spec, props, stateDir, warmupRecords, readyTimeoutS)
                : Map.of("records", 0);

        final Gate gate = new Gate();
        final KafkaStreams streams = new KafkaStreams(
                Topologies.build(
                        spec.get("topology").asText(),
                        spec.get("input_topic").asText(),
                        spec.get("output_topic").asText(),
                        gate),
                props,
                gate.clientSupplier());
        final AtomicReference<Throwable> failure = new AtomicReference<>();
        streams.setUncaughtExceptionHandler(e -> {
            failure.compareAndSet(null, e);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });

        final Set<String> expectedTasks = new TreeSet<>();
        for (int p = 0; p < partitions; p++) {
            expectedTasks.add("0_" + p);
        }
        final long started = System.nanoTime();
        streams.start();
        final Map<String, Object> status;
        final boolean closed;
        final double closeS;
        try {
            // -- gated: wait until RUNNING with a stable, balanced assignment --------------
            final long since = waitStable(streams, failure, expectedTasks, threads, settleS,
                    started, readyTimeoutS);
            events.emit("ready", Map.of(
                    "join_s", (since - started) / 1e9,
                    "ready_s", (System.nanoTime() - started) / 1e9,
                    "assignment", assignment(streams),
                    "warmup", warmup));

            commands.go.await();
            gate.open();
            events.emit("go", Map.of("processed_at_go", Map.of()));

            // -- running: watch until stop ----------------------------------------------------
            boolean processedAllSent = backlog <= 0;
            while (!commands.stop.await(50, TimeUnit.MILLISECONDS)) {
                checkFailure(streams, failure);
                if (!processedAllSent && gate.processed() >= backlog) {
                    processedAllSent = true;
                    events.emit("processed_all", Map.of());
                }
            }
            status = Map.of(
                    "state", streams.state().toString(),
                    "processed", gate.processed(),
                    "threads", assignment(streams).size());
        } finally {
            final long closeStarted = System.nanoTime();
            closed = streams.close(Duration.ofSeconds(30));
            closeS = (System.nanoTime() - closeStarted) / 1e9;
            deleteTree(stateDir);
        }
        return Map.of("status", status, "close_s", closeS, "closed_cleanly", closed);
    }

    /**
     * Warm the JVM up before the measured run: the same topology, mode and thread count under
     * another {@code application.id} (so another consumer group and changelog), reading the same
     * input topic into {@code <application.id>-warmup-out} until {@code records} input records
     * went through; then closed, and its state directory deleted.
     *
     * <p>Why: a fresh JVM interprets, then compiles the hot paths (C1, then C2) on the same two
     * cores; on a run of a few seconds that compilation is a large share of the CPU and a long
     * service never pays it again. The measured instance starts after this one closed, so its
     * connections, threads and timing are its own; peak RSS (VmHWM) includes the warm-up, as a
     * long-running JVM's would.
     */
    private static Map<String, Object> warmUp(
            final JsonNode spec,
            final Properties measured,
            final Path stateDir,
            final long records,
            final double timeoutS) throws Exception {
        final long started = System.nanoTime();
        final String appId = spec.get("application_id").asText() + "-warmup";
        final String output = spec.get("application_id").asText() + "-warmup-out";
        try (Admin admin = Admin.create(Map.of(
                AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, spec.get("bootstrap").asText()))) {
            admin.createTopics(List.of(new NewTopic(
                    output, Optional.of(spec.get("partitions").asInt()), Optional.empty())))
                    .all().get(30, TimeUnit.SECONDS);
        }
        final Properties props = new Properties();
        props.putAll(measured);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.resolve("warmup").toString());
        final Gate gate = new Gate();
        gate.open();
        final AtomicReference<Throwable> failure = new AtomicReference<>();
        final KafkaStreams streams = new KafkaStreams(
                Topologies.build(
                        spec.get("topology").asText(), spec.get("input_topic").asText(), output, gate),
                props);
        streams.setUncaughtExceptionHandler(e -> {
            failure.compareAndSet(null, e);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();
        try {
            while (gate.processed() < records) {
                checkFailure(streams, failure);
                if ((System.nanoTime() - started) / 1e9 > timeoutS) {
                    throw new IllegalStateException(String.format(
                            "warm-up: %d of %d records after %.0f s", gate.processed(), records, timeoutS));
                }
                Thread.sleep(20);
            }
        } finally {
            streams.close(Duration.ofSeconds(30));
        }
        deleteTree(stateDir.resolve("warmup"));
        return Map.of("records", gate.processed(), "seconds", (System.nanoTime() - started) / 1e9);
    }

    /**
     * Wait until the application is RUNNING and its threads' active tasks are complete, balanced
     * and unchanged for {@code settleS}; returns when they last changed (nanoTime).
     */
    private static long waitStable(
            final KafkaStreams streams,
            final AtomicReference<Throwable> failure,
            final Set<String> expectedTasks,
            final int threads,
            final double settleS,
            final long started,
            final double timeoutS) throws InterruptedException {
        String last = null;
        long since = System.nanoTime();
        while (true) {
            checkFailure(streams, failure);
            final List<List<String>> assignment = assignment(streams);
            String signature = signature(assignment, expectedTasks, threads);
            if (streams.state() != KafkaStreams.State.RUNNING) {
                signature = null;
            }
            final long now = System.nanoTime();
            if (!Objects.equals(signature, last)) {
                last = signature;
                since = now;
            } else if (signature != null && (now - since) / 1e9 >= settleS) {
                return since;
            }
            if ((now - started) / 1e9 > timeoutS) {
                throw new IllegalStateException(String.format(
                        "no stable assignment after %.0f s (state %s, last %s)",
                        timeoutS, streams.state(), assignment));
            }
            Thread.sleep(50);
        }
    }

    private static void checkFailure(final KafkaStreams streams, final AtomicReference<Throwable> failure) {
        final Throwable e = failure.get();
        if (e != null) {
            throw new IllegalStateException("Kafka Streams failed: " + describe(e), e);
        }
        final KafkaStreams.State state = streams.state();
        if (state == KafkaStreams.State.ERROR
                || state == KafkaStreams.State.NOT_RUNNING
                || state == KafkaStreams.State.PENDING_ERROR) {
            throw new IllegalStateException("Kafka Streams is " + state);
        }
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

    /** Active task ids per stream thread, each sorted; threads ordered by name. */
    private static List<List<String>> assignment(final KafkaStreams streams) {
        final List<ThreadMetadata> metadata = new ArrayList<>(streams.metadataForLocalThreads());
        metadata.sort(Comparator.comparing(ThreadMetadata::threadName));
        final List<List<String>> out = new ArrayList<>();
        for (final ThreadMetadata thread : metadata) {
            final List<String> tasks = new ArrayList<>();
            thread.activeTasks().forEach(t -> tasks.add(t.taskId().toString()));
            tasks.sort(null);
            out.add(tasks);
        }
        return out;
    }

    /** What must stay unchanged for settle_s before the run may go; null: not ready. */
    private static String signature(
            final List<List<String>> assignment, final Set<String> expected, final int threads) {
        if (assignment.size() != threads) {
            return null;
        }
        final Set<String> all = new TreeSet<>();
        int total = 0;
        int min = Integer.MAX_VALUE;
        int max = 0;
        for (final List<String> tasks : assignment) {
            all.addAll(tasks);
            total += tasks.size();
            min = Math.min(min, tasks.size());
            max = Math.max(max, tasks.size());
        }
        if (total != expected.size() || !all.equals(expected) || max - min > 1) {
            return null;
        }
        return assignment.toString();
    }

    private static void deleteTree(final Path root) {
        try (Stream<Path> paths = Files.walk(root)) {
            paths.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
        } catch (final IOException ignored) {
            // a temp directory: best effort
        }
    }

    /** JSON-lines events to the harness's pipe. */
    static final class Events {
        private final PrintWriter out;

        Events(final int fd) throws IOException {
            out = new PrintWriter(Files.newBufferedWriter(
                    Path.of("/proc/self/fd/" + fd), StandardCharsets.UTF_8), false);
        }

        synchronized void emit(final String kind, final Map<String, ?> data) {
            final Map<String, Object> event = new java.util.LinkedHashMap<>();
            event.put("event", kind);
            event.put("t", System.nanoTime() / 1e9);
            event.putAll(data);
            try {
                out.println(JSON.writeValueAsString(event));
            } catch (final IOException e) {
                throw new IllegalStateException(e);
            }
            out.flush();
        }
    }

    /** Reads {@code go} / {@code stop} from stdin; end of input means both. */
    static final class Commands extends Thread {
        final CountDownLatch go = new CountDownLatch(1);
        final CountDownLatch stop = new CountDownLatch(1);

        Commands() {
            super("bench-commands");
            setDaemon(true);
        }

        @Override
        public void run() {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                String line;
                while ((line = in.readLine()) != null) {
                    switch (line.strip()) {
                        case "go" -> go.countDown();
                        case "stop" -> stop.countDown();
                        default -> { }
                    }
                }
            } catch (final IOException ignored) {
                // stdin closed: treated as stop below
            }
            go.countDown();
            stop.countDown();
        }
    }
}
