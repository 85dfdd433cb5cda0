package peers;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.EmitStrategy;
import org.apache.kafka.streams.kstream.GlobalKTable;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.SlidingWindows;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.Suppressed.BufferConfig;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.ValueJoiner;
import org.apache.kafka.streams.kstream.WindowedSerdes;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.state.WindowStore;

/**
 * The Kafka Streams side of the differential tests ({@code tests/differential/}).
 *
 * <p>Each topology here has a twin written with the Python DSL in {@code
 * tests/differential/topologies.py}, under the same name; both read the same input topic and
 * write their own output topic, which the tests compare record for record.
 *
 * <p>Usage: {@code java -cp ks-peer.jar peers.DifferentialTopologies BOOTSTRAP STATE_DIR
 * NAME:APPLICATION_ID:INPUT:OUTPUT ...}. Runs one {@link KafkaStreams} per argument (one stream
 * thread each, caching off, a 100 ms commit interval) in this one JVM, prints {@code ready} once
 * every instance is RUNNING, and closes them all (a final commit) when a line {@code stop} or
 * end of input arrives on stdin; prints {@code stopped} then. The test decides when to stop: when
 * every application's consumer group has committed the end of its input topics.
 *
 * <p>Keys and values are UTF-8 strings; counts and sums are 8-byte big-endian longs; windowed
 * keys use Kafka's time-windowed serde layout (key bytes + 8-byte window start).
 */
public final class DifferentialTopologies {
    static final Duration WINDOW = Duration.ofSeconds(10);
    static final Duration HOP = Duration.ofSeconds(5);
    static final Duration GRACE = Duration.ofSeconds(3);
    static final Duration JOIN_DIFFERENCE = Duration.ofSeconds(5);
    static final Duration JOIN_GRACE = Duration.ofSeconds(2);
    static final Duration SESSION_GAP = Duration.ofMillis(1500);
    static final Duration CLICK_GAP = Duration.ofSeconds(2);
    static final Duration CLICK_GRACE = Duration.ofSeconds(1);
    static final Duration SLIDE = Duration.ofSeconds(2);

    private DifferentialTopologies() {}

    public static void main(final String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println(
                    "usage: DifferentialTopologies BOOTSTRAP STATE_DIR NAME:APP_ID:INPUT:OUTPUT ...");
            System.exit(2);
        }
        final String bootstrap = args[0];
        final Path stateDir = Path.of(args[1]);
        final List<KafkaStreams> running = new ArrayList<>();
        for (int i = 2; i < args.length; i++) {
            final String[] parts = args[i].split(":", 4);
            final Topology topology = build(parts[0], parts[2], parts[3]);
            final KafkaStreams streams =
                    new KafkaStreams(topology, config(bootstrap, parts[1], stateDir));
            running.add(streams);
        }
        running.forEach(KafkaStreams::start);
        // Forty applications joining their groups on a loaded 2-core machine (CI runs
        // the suite on several workers) took more than two minutes at times.
        final long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(300);
        while (!running.stream().allMatch(s -> s.state() == KafkaStreams.State.RUNNING)) {
            if (System.nanoTime() > deadline
                    || running.stream().anyMatch(s -> s.state() == KafkaStreams.State.ERROR)) {
                final StringBuilder states = new StringBuilder();
                for (int i = 0; i < running.size(); i++) {
                    states.append(' ').append(args[i + 2].split(":", 4)[0]).append('=')
                            .append(running.get(i).state());
                }
                System.out.println("failed to start:" + states);
                System.out.flush();
                running.forEach(s -> s.close(Duration.ofSeconds(10)));
                System.exit(1);
            }
            Thread.sleep(50);
        }
        System.out.println("ready");
        System.out.flush();
        final BufferedReader stdin =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = stdin.readLine()) != null && !line.trim().equals("stop")) {
            // wait for the test's word
        }
        running.forEach(s -> s.close(Duration.ofSeconds(30)));
        System.out.println("stopped");
        System.out.flush();
    }

    static Properties config(final String bootstrap, final String appId, final Path stateDir) {
        final Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.resolve(appId).toString());
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        // Outer-join results of records whose window closed are emitted when stream time
        // passes the window's end; by default at most once a second of wall-clock time,
        // which makes the output depend on timing. Every record checks here.
        props.put("__emit.interval.ms.kstreams.outer.join.spurious.results.fix__", 0L);
        // Likewise the final results of EmitStrategy.onWindowClose().
        props.put("__emit.interval.ms.kstreams.windowed.aggregation__", 0L);
        props.put(StreamsConfig.consumerPrefix("session.timeout.ms"), 6000);
        props.put(StreamsConfig.consumerPrefix("heartbeat.interval.ms"), 500);
        return props;
    }

    /** Values of the join tests: "L..." records are the left stream, "R..." the right one. */
    static boolean side(final String value, final String prefix) {
        return value != null && value.startsWith(prefix);
    }

    static final ValueJoiner<String, String, String> JOINER = (l, r) -> l + "+" + r;

    /** A foreign-key join's extractor: an "L<n>" row points at the right row {@code k<n mod 5>}. */
    static String foreignKey(final String value) {
        return "k" + (Long.parseLong(value.substring(1)) % 5);
    }

    static Topology build(final String name, final String input, final String output) {
        final StreamsBuilder builder = new StreamsBuilder();
        final Serde<String> str = Serdes.String();
        final Serde<Long> lng = Serdes.Long();
        final KStream<String, String> in = builder.stream(input, Consumed.with(str, str));
        switch (name) {
            case "count" -> in.groupByKey().count().toStream().to(output, Produced.with(str, lng));
            case "reduce" -> in.groupByKey()
                    .reduce((agg, v) -> agg + "|" + v)
                    .toStream()
                    .to(output, Produced.with(str, str));
            case "aggregate" -> in.groupByKey()
                    .aggregate(
                            () -> 0L,
                            (k, v, agg) -> agg + v.length(),
                            Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>with(str, lng))
                    .toStream()
                    .to(output, Produced.with(str, lng));
            case "tumbling_count" -> in.groupByKey()
                    .windowedBy(TimeWindows.ofSizeAndGrace(WINDOW, GRACE))
                    .count()
                    .toStream()
                    .to(output, Produced.with(
                            WindowedSerdes.timeWindowedSerdeFrom(String.class, WINDOW.toMillis()),
                            lng));
            case "hopping_count" -> in.groupByKey()
                    .windowedBy(TimeWindows.ofSizeAndGrace(WINDOW, GRACE).advanceBy(HOP))
                    .count()
                    .toStream()
                    .to(output, Produced.with(
                            WindowedSerdes.timeWindowedSerdeFrom(String.class, WINDOW.toMillis()),
                            lng));
            case "table_left_join" -> {
                final KTable<String, String> table = in.filter((k, v) -> side(v, "T")).toTable();
                in.filter((k, v) -> side(v, "S"))
                        .leftJoin(table, (s, t) -> s + "/" + t)
                        .to(output, Produced.with(str, str));
            }
            case "table_filter_map" -> in.toTable(Materialized.as("tfm-store"))
                    .filter((k, v) -> v.length() % 2 == 0)
                    .mapValues(v -> v.toUpperCase())
                    .toStream()
                    .to(output, Produced.with(str, str));
            case "select_key_count" -> in.filter((k, v) -> v != null)
                    .selectKey((k, v) -> v.substring(0, 2))
                    .groupByKey(Grouped.as("by-prefix"))
                    .count()
                    .toStream()
                    .to(output, Produced.with(str, lng));
            case "to_table" -> in.toTable().toStream().to(output, Produced.with(str, str));
            case "ss_join", "ss_left_join", "ss_outer_join", "ss_outer_join_no_grace" -> {
                final KStream<String, String> left = in.filter((k, v) -> side(v, "L"));
                final KStream<String, String> right = in.filter((k, v) -> side(v, "R"));
                final JoinWindows windows = name.endsWith("no_grace")
                        ? JoinWindows.ofTimeDifferenceWithNoGrace(JOIN_DIFFERENCE)
                        : JoinWindows.ofTimeDifferenceAndGrace(JOIN_DIFFERENCE, JOIN_GRACE);
                final StreamJoined<String, String, String> joined = StreamJoined.with(str, str, str);
                final KStream<String, String> out = switch (name) {
                    case "ss_join" -> left.join(right, JOINER, windows, joined);
                    case "ss_left_join" -> left.leftJoin(right, JOINER, windows, joined);
                    default -> left.outerJoin(right, JOINER, windows, joined);
                };
                out.to(output, Produced.with(str, str));
            }
            case "ss_join_windowed_count" -> {
                // Composed: an outer join counted per key in tumbling windows (no re-keying:
                // see tests/differential/topologies.py).
                final KStream<String, String> left = in.filter((k, v) -> side(v, "L"));
                final KStream<String, String> right = in.filter((k, v) -> side(v, "R"));
                left.outerJoin(right, JOINER,
                                JoinWindows.ofTimeDifferenceAndGrace(JOIN_DIFFERENCE, JOIN_GRACE),
                                StreamJoined.with(str, str, str))
                        .groupByKey(Grouped.with(str, str))
                        .windowedBy(TimeWindows.ofSizeAndGrace(WINDOW, GRACE))
                        .count()
                        .toStream()
                        .to(output, Produced.with(
                                WindowedSerdes.timeWindowedSerdeFrom(String.class, WINDOW.toMillis()),
                                lng));
            }
            case "session_count", "session_reduce", "session_aggregate", "session_count_on_close",
                    "tumbling_count_suppress", "table_suppress_time_limit", "clickstream_sessions",
                    "sliding_count", "sliding_aggregate", "sliding_count_suppress",
                    "hopping_count_on_close" ->
                sessionsAndSuppression(name, in, output);
            // Table-table joins and table re-grouping (tests/differential/topologies.py):
            // each table takes one letter's records and every tombstone.
            case "tt_join", "tt_left_join", "tt_outer_join", "tt_outer_join_materialized" -> {
                final KTable<String, String> left =
                        in.filter((k, v) -> v == null || v.startsWith("L")).toTable();
                final KTable<String, String> right =
                        in.filter((k, v) -> v == null || v.startsWith("R")).toTable();
                final KTable<String, String> out = switch (name) {
                    case "tt_join" -> left.join(right, JOINER);
                    case "tt_left_join" -> left.leftJoin(right, JOINER);
                    case "tt_outer_join" -> left.outerJoin(right, JOINER);
                    default -> left.outerJoin(right, JOINER,
                            Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as(
                                    "tt-outer-store").withValueSerde(str));
                };
                out.toStream().to(output, Produced.with(str, str));
            }
            case "table_group_count" -> in.toTable()
                    .groupBy((k, v) -> KeyValue.pair(v.substring(0, 1), v), Grouped.with(str, str))
                    .count()
                    .toStream()
                    .to(output, Produced.with(str, lng));
            case "table_group_reduce" -> in.toTable()
                    .groupBy((k, v) -> KeyValue.pair(v.substring(0, 1), Long.parseLong(v.substring(1))),
                            Grouped.with(str, lng))
                    .reduce(Long::sum, (agg, v) -> agg - v)
                    .toStream()
                    .to(output, Produced.with(str, lng));
            case "table_group_aggregate" -> in.toTable()
                    .groupBy((k, v) -> KeyValue.pair(v.substring(0, 1), v), Grouped.with(str, str))
                    .aggregate(
                            () -> 0L,
                            (k, v, agg) -> agg + Long.parseLong(v.substring(1)),
                            (k, v, agg) -> agg - Long.parseLong(v.substring(1)),
                            Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>with(str, lng))
                    .toStream()
                    .to(output, Produced.with(str, lng));
            case "tt_join_group_count" -> {
                final KTable<String, String> left =
                        in.filter((k, v) -> v == null || v.startsWith("L")).toTable();
                final KTable<String, String> right =
                        in.filter((k, v) -> v == null || v.startsWith("R")).toTable();
                left.leftJoin(right, JOINER)
                        .groupBy((k, v) -> KeyValue.pair(v.endsWith("+null") ? "alone" : "paired", v),
                                Grouped.with(str, str))
                        .count()
                        .toStream()
                        .to(output, Produced.with(str, lng));
            }
            case "fk_join", "fk_left_join" -> {
                final KTable<String, String> orders =
                        in.filter((k, v) -> v == null || v.startsWith("L")).toTable();
                final KTable<String, String> customers =
                        in.filter((k, v) -> v == null || v.startsWith("R")).toTable();
                (name.equals("fk_join")
                                ? orders.join(customers, DifferentialTopologies::foreignKey, JOINER)
                                : orders.leftJoin(customers, DifferentialTopologies::foreignKey, JOINER))
                        .toStream()
                        .to(output, Produced.with(str, str));
            }
            case "enrichment" -> {
                final KTable<String, String> orders =
                        in.filter((k, v) -> v == null || v.startsWith("L")).toTable();
                final KTable<String, String> customers =
                        in.filter((k, v) -> v == null || v.startsWith("R")).toTable();
                final KTable<String, String> extras =
                        in.filter((k, v) -> v == null || v.startsWith("S")).toTable();
                orders.join(customers, DifferentialTopologies::foreignKey, JOINER)
                        .leftJoin(extras, JOINER)
                        .toStream()
                        .to(output, Produced.with(str, str));
            }
            // Global table (tests/differential/topologies.py): its topic is "<input>-global",
            // written whole before the applications start.
            case "global_join" -> {
                final GlobalKTable<String, String> table =
                        builder.globalTable(input + "-global", Consumed.with(str, str));
                final KStream<String, String> s =
                        in.filter((k, v) -> v == null || v.startsWith("S"));
                s.join(table, DifferentialTopologies::globalKey, (v, t) -> "J:" + v + "/" + t)
                        .to(output, Produced.with(str, str));
                s.leftJoin(table, DifferentialTopologies::globalKey, (v, t) -> "L:" + v + "/" + t)
                        .to(output, Produced.with(str, str));
            }
            case "cogroup_aggregate", "cogroup_tumbling", "cogroup_session", "cogroup_repartition",
                    "headers_process" ->
                DifferentialCogroupHeaders.build(name, in, output);
            default -> throw new IllegalArgumentException("unknown differential topology " + name);
        }
        return builder.build();
    }

    /** Session windows, the on-window-close emit strategy and suppression (issue 35). */
    static void sessionsAndSuppression(
            final String name, final KStream<String, String> in, final String output) {
        final Serde<String> str = Serdes.String();
        final Serde<Long> lng = Serdes.Long();
        final var sessionSerde = WindowedSerdes.sessionWindowedSerdeFrom(String.class);
        final SessionWindows sessions = SessionWindows.ofInactivityGapAndGrace(SESSION_GAP, GRACE);
        final KStream<String, String> nonNull = in.filter((k, v) -> v != null);
        final var slidingSerde = WindowedSerdes.timeWindowedSerdeFrom(String.class, SLIDE.toMillis());
        switch (name) {
            case "session_count" -> in.groupByKey()
                    .windowedBy(sessions)
                    .count()
                    .toStream()
                    .to(output, Produced.with(sessionSerde, lng));
            case "session_reduce" -> nonNull.groupByKey()
                    .windowedBy(sessions)
                    .reduce((agg, v) -> agg + "|" + v)
                    .toStream()
                    .to(output, Produced.with(sessionSerde, str));
            case "session_aggregate" -> nonNull.groupByKey()
                    .windowedBy(sessions)
                    .aggregate(
                            () -> 0L,
                            (k, v, agg) -> agg + v.length(),
                            (k, a, b) -> a + b,
                            Materialized.<String, Long, SessionStore<Bytes, byte[]>>with(str, lng))
                    .toStream()
                    .to(output, Produced.with(sessionSerde, lng));
            case "session_count_on_close" -> in.groupByKey()
                    .windowedBy(sessions)
                    .emitStrategy(EmitStrategy.onWindowClose())
                    .count()
                    .toStream()
                    .to(output, Produced.with(sessionSerde, lng));
            case "tumbling_count_suppress" -> in.groupByKey()
                    .windowedBy(TimeWindows.ofSizeAndGrace(WINDOW, GRACE))
                    .count()
                    .suppress(Suppressed.untilWindowCloses(BufferConfig.unbounded()))
                    .toStream()
                    .to(output, Produced.with(
                            WindowedSerdes.timeWindowedSerdeFrom(String.class, WINDOW.toMillis()),
                            lng));
            case "table_suppress_time_limit" -> in.toTable()
                    .suppress(Suppressed.<String>untilTimeLimit(
                                    Duration.ofSeconds(2), BufferConfig.maxRecords(3))
                            .withName("hold"))
                    .toStream()
                    .to(output, Produced.with(str, str));
            case "clickstream_sessions" -> nonNull.groupByKey()
                    .windowedBy(SessionWindows.ofInactivityGapAndGrace(CLICK_GAP, CLICK_GRACE))
                    .aggregate(
                            () -> "",
                            (k, v, agg) -> agg + v.charAt(0),
                            (k, a, b) -> a + b,
                            Materialized.<String, String, SessionStore<Bytes, byte[]>>with(str, str))
                    .suppress(Suppressed.untilWindowCloses(BufferConfig.unbounded()))
                    .toStream()
                    .map((wk, v) -> KeyValue.pair(
                            wk.key(), wk.window().start() + "-" + wk.window().end() + ":" + v))
                    .to(output, Produced.with(str, str));
            case "sliding_count" -> in.groupByKey()
                    .windowedBy(SlidingWindows.ofTimeDifferenceAndGrace(SLIDE, GRACE))
                    .count()
                    .toStream()
                    .to(output, Produced.with(slidingSerde, lng));
            case "sliding_aggregate" -> in.groupByKey()
                    .windowedBy(SlidingWindows.ofTimeDifferenceAndGrace(SLIDE, GRACE))
                    .aggregate(
                            () -> "",
                            (k, v, agg) -> agg + v.charAt(0),
                            Materialized.<String, String, WindowStore<Bytes, byte[]>>with(str, str))
                    .toStream()
                    .to(output, Produced.with(slidingSerde, str));
            case "sliding_count_suppress" -> in.groupByKey()
                    .windowedBy(SlidingWindows.ofTimeDifferenceAndGrace(SLIDE, GRACE))
                    .count()
                    .suppress(Suppressed.untilWindowCloses(BufferConfig.unbounded()))
                    .toStream()
                    .to(output, Produced.with(slidingSerde, lng));
            case "hopping_count_on_close" -> in.groupByKey()
                    .windowedBy(TimeWindows.ofSizeAndGrace(WINDOW, GRACE).advanceBy(HOP))
                    .emitStrategy(EmitStrategy.onWindowClose())
                    .count()
                    .toStream()
                    .to(output, Produced.with(
                            WindowedSerdes.timeWindowedSerdeFrom(String.class, WINDOW.toMillis()),
                            lng));
            default -> throw new IllegalArgumentException("unknown differential topology " + name);
        }
    }

    /** A global join's key mapper: "S<n>" looks up k<n mod 5>; null for n divisible by 7. */
    static String globalKey(final String key, final String value) {
        if (value == null) {
            return null;
        }
        final long n = Long.parseLong(value.substring(1));
        return n % 7 == 0 ? null : "k" + (n % 5);
    }
}
