package peers;

import com.fasterxml.jackson.core.StreamReadFeature;
import com.fasterxml.jackson.core.StreamWriteFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.json.JsonMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.time.Duration;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.kstream.WindowedSerdes;

/**
 * The benchmark topologies, written as a Kafka Streams user would write them.
 *
 * <p>Each mirrors the runtime's topology of the same name in {@code benchmarks/compare/workloads.py}
 * and produces the same output bytes from the same input bytes:
 *
 * <ul>
 *   <li>{@code stateless}: JSON value in, {@code "seen": true} appended, compact JSON out (the
 *       runtime's {@code serdes.JSON}: no spaces, keys in input order). Jackson's tree model is
 *       the Java counterpart of {@code json.loads}/{@code json.dumps}; doubles are written with
 *       Jackson's shortest round-trip writer, as Python's {@code repr} does.
 *   <li>{@code count}: {@code groupByKey().count()} into a RocksDB store named {@code counts}
 *       (changelog {@code <application.id>-counts-changelog}, record cache on, all defaults),
 *       counts written as 8-byte big-endian longs.
 *   <li>{@code echo}: {@code mapValues} sends the value to the local echo server and returns the
 *       reply (about 1 ms per record).
 *   <li>{@code join}: the input topic (left) {@code join}s the topic {@code <input>-other}
 *       (right, {@link #OTHER_INPUT_SUFFIX}) with {@code JoinWindows} of 1 s time difference and
 *       10 s grace, String keys and values, the joined value {@code left + "|" + right} (the
 *       constants and the joiner of {@code workloads.py}: JOIN_DIFFERENCE_MS, JOIN_GRACE_MS,
 *       {@code join_values}); window stores and changelogs all defaults.
 *   <li>{@code session}: {@code groupByKey().windowedBy(SessionWindows 1 s gap, 2 s
 *       grace).count()} into a store named {@code sessions}, written with the session-windowed
 *       key serde (key bytes, end, start) and 8-byte longs, tombstones of merged-away sessions
 *       included.
 * </ul>
 *
 * <p>Every topology has one {@code peek} after each source, {@link Gate#pass}, which counts the
 * records taken in (the harness's "processed" figure; the join's counts both topics').
 */
final class Topologies {
    static final String STORE = "counts";
    static final String SESSION_STORE = "sessions";
    static final String JOIN_STORE = "joined";
    /** The join's right input: the input topic's name plus this (workloads.other_input_topic). */
    static final String OTHER_INPUT_SUFFIX = "-other";

    private Topologies() {}

    static Topology build(
            final String kind, final String input, final String output, final Gate gate) {
        final StreamsBuilder builder = new StreamsBuilder();
        switch (kind) {
            case "stateless" -> {
                final Serde<JsonNode> json = jsonSerde();
                builder.stream(input, Consumed.with(Serdes.String(), json))
                        .peek((k, v) -> gate.pass())
                        .mapValues(Topologies::enrich)
                        .to(output, Produced.with(Serdes.String(), json));
            }
            case "count" -> {
                final KStream<String, String> stream =
                        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()));
                stream.peek((k, v) -> gate.pass())
                        .groupByKey()
                        .count(Materialized.as(STORE))
                        .toStream()
                        .to(output, Produced.with(Serdes.String(), Serdes.Long()));
            }
            case "join" -> {
                final KStream<String, String> left = builder
                        .stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                        .peek((k, v) -> gate.pass());
                final KStream<String, String> right = builder
                        .stream(input + OTHER_INPUT_SUFFIX, Consumed.with(Serdes.String(), Serdes.String()))
                        .peek((k, v) -> gate.pass());
                left.join(
                                right,
                                (l, r) -> l + "|" + r,
                                JoinWindows.ofTimeDifferenceAndGrace(
                                        Duration.ofMillis(1000), Duration.ofMillis(10_000)),
                                StreamJoined.with(Serdes.String(), Serdes.String(), Serdes.String())
                                        .withStoreName(JOIN_STORE))
                        .to(output, Produced.with(Serdes.String(), Serdes.String()));
            }
            case "session" -> builder
                    .stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                    .peek((k, v) -> gate.pass())
                    .groupByKey()
                    .windowedBy(SessionWindows.ofInactivityGapAndGrace(
                            Duration.ofMillis(1000), Duration.ofMillis(2000)))
                    .count(Materialized.as(SESSION_STORE))
                    .toStream()
                    .to(output, Produced.with(
                            WindowedSerdes.sessionWindowedSerdeFrom(String.class), Serdes.Long()));
            case "echo" -> builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                    .peek((k, v) -> gate.pass())
                    .mapValues(EchoClient::call)
                    .to(output, Produced.with(Serdes.String(), Serdes.String()));
            default -> throw new IllegalArgumentException("unknown topology " + kind);
        }
        return builder.build();
    }

    /** The stateless map function: add one field. */
    static JsonNode enrich(final JsonNode value) {
        ((ObjectNode) value).put("seen", true);
        return value;
    }

    // -- the JSON serde ---------------------------------------------------------------------

    private static final JsonMapper MAPPER = JsonMapper.builder()
            .enable(StreamReadFeature.USE_FAST_DOUBLE_PARSER)
            .enable(StreamWriteFeature.USE_FAST_DOUBLE_WRITER)
            .build();

    static Serde<JsonNode> jsonSerde() {
        final Serializer<JsonNode> serializer = (topic, node) -> {
            if (node == null) {
                return null;
            }
            try {
                return MAPPER.writeValueAsBytes(node);
            } catch (final IOException e) {
                throw new UncheckedIOException(e);
            }
        };
        final Deserializer<JsonNode> deserializer = (topic, data) -> {
            if (data == null) {
                return null;
            }
            try {
                return MAPPER.readTree(data);
            } catch (final IOException e) {
                throw new UncheckedIOException("not JSON in " + topic, e);
            }
        };
        return Serdes.serdeFrom(serializer, deserializer);
    }
}
