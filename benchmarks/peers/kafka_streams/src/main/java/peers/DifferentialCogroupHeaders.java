package peers;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.WindowedSerdes;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.state.WindowStore;

/**
 * Cogroup (KIP-150) and record-header twins of the differential tests (issue 35, items 7 and
 * 8), called by {@link DifferentialTopologies#build}; the Python side is in {@code
 * tests/differential/topologies.py} under the same names.
 *
 * <p>Cogroups: the input's "L" records and its "R" records are two grouped streams (keyed as
 * they come, so no repartition), aggregated into one long per key: an "L&lt;n&gt;" adds n, an
 * "R" record subtracts 1.
 */
final class DifferentialCogroupHeaders {
    static final Duration WINDOW = DifferentialTopologies.WINDOW;
    static final Duration GRACE = DifferentialTopologies.GRACE;

    private DifferentialCogroupHeaders() {}

    static void build(final String name, final KStream<String, String> in, final String output) {
        final Serde<String> str = Serdes.String();
        final Serde<Long> lng = Serdes.Long();
        final KGroupedStream<String, String> left = in.filter(
                (k, v) -> DifferentialTopologies.side(v, "L")).groupByKey(Grouped.with(str, str));
        final KGroupedStream<String, String> right = in.filter(
                (k, v) -> DifferentialTopologies.side(v, "R")).groupByKey(Grouped.with(str, str));
        switch (name) {
            case "cogroup_aggregate" -> left
                    .<Long>cogroup((k, v, agg) -> agg + Long.parseLong(v.substring(1)))
                    .cogroup(right, (k, v, agg) -> agg - 1)
                    .aggregate(() -> 0L,
                            Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>with(str, lng))
                    .toStream()
                    .to(output, Produced.with(str, lng));
            case "cogroup_tumbling" -> left
                    .<Long>cogroup((k, v, agg) -> agg + Long.parseLong(v.substring(1)))
                    .cogroup(right, (k, v, agg) -> agg - 1)
                    .windowedBy(TimeWindows.ofSizeAndGrace(WINDOW, GRACE))
                    .aggregate(() -> 0L,
                            Materialized.<String, Long, WindowStore<Bytes, byte[]>>with(str, lng))
                    .toStream()
                    .to(output, Produced.with(
                            WindowedSerdes.timeWindowedSerdeFrom(String.class, WINDOW.toMillis()),
                            lng));
            case "cogroup_session" -> left
                    .<Long>cogroup((k, v, agg) -> agg + Long.parseLong(v.substring(1)))
                    .cogroup(right, (k, v, agg) -> agg - 1)
                    .windowedBy(SessionWindows.ofInactivityGapAndGrace(
                            DifferentialTopologies.SESSION_GAP, GRACE))
                    .aggregate(() -> 0L, (k, a, b) -> a + b,
                            Materialized.<String, Long, SessionStore<Bytes, byte[]>>with(str, lng))
                    .toStream()
                    .to(output, Produced.with(
                            WindowedSerdes.sessionWindowedSerdeFrom(String.class), lng));
            case "cogroup_repartition" -> in.filter((k, v) -> DifferentialTopologies.side(v, "L"))
                    .selectKey((k, v) -> DifferentialTopologies.foreignKey(v))
                    .groupByKey(Grouped.with(str, str))
                    .<Long>cogroup((k, v, agg) -> agg + Long.parseLong(v.substring(1)))
                    .cogroup(right, (k, v, agg) -> agg - 1)
                    .aggregate(() -> 0L,
                            Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>with(str, lng))
                    .toStream()
                    .to(output, Produced.with(str, lng));
            case "headers_process" -> in.process(Relabel::new)
                    .mapValues(v -> v == null ? null : v.toUpperCase())
                    .to(output, Produced.with(str, str));
            default -> throw new IllegalArgumentException("unknown differential topology " + name);
        }
    }

    /**
     * Forwards each record with its "letter" header lower-cased (or "none" without one) and a
     * "length" header added: new headers, the input's left alone.
     */
    static final class Relabel implements Processor<String, String, String, String> {
        private ProcessorContext<String, String> context;

        @Override
        public void init(final ProcessorContext<String, String> context) {
            this.context = context;
        }

        @Override
        public void process(final Record<String, String> record) {
            final Headers headers = new RecordHeaders();
            String letter = "none";
            for (final Header header : record.headers()) {
                if (header.key().equals("letter")) {
                    letter = header.value() == null
                            ? "null" : new String(header.value(), StandardCharsets.UTF_8).toLowerCase();
                } else {
                    headers.add(header);
                }
            }
            headers.add("letter", letter.getBytes(StandardCharsets.UTF_8));
            final String length = record.value() == null ? null : String.valueOf(record.value().length());
            headers.add("length", length == null ? null : length.getBytes(StandardCharsets.UTF_8));
            context.forward(record.withHeaders(headers));
        }
    }
}
