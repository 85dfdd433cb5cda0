package peers;

import java.io.BufferedInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;

/**
 * The I/O-bound workloads' remote call, as {@code benchmarks/compare/echo.py}'s {@code echo_call}:
 * one blocking TCP connection per calling thread to the harness's echo server, which answers
 * each line after its delay (about 1 ms). Whichever thread processes the task makes the call:
 * a stream thread in classic mode, a task executor in processing-threads mode.
 */
final class EchoClient {
    static volatile InetSocketAddress address;

    private static final ThreadLocal<EchoClient> LOCAL = ThreadLocal.withInitial(EchoClient::connect);

    private final OutputStream out;
    private final InputStream in;
    private final ByteArrayOutputStream line = new ByteArrayOutputStream(64);

    private EchoClient(final Socket socket) throws IOException {
        out = socket.getOutputStream();
        in = new BufferedInputStream(socket.getInputStream());
    }

    private static EchoClient connect() {
        final InetSocketAddress target = address;
        if (target == null) {
            throw new IllegalStateException("echo server address not set");
        }
        try {
            final Socket socket = new Socket();
            socket.setTcpNoDelay(true);
            socket.connect(target);
            return new EchoClient(socket);
        } catch (final IOException e) {
            throw new UncheckedIOException("cannot connect to the echo server " + target, e);
        }
    }

    /** Send {@code value} (one line) and return the server's reply. */
    static String call(final String value) {
        return LOCAL.get().roundTrip(value);
    }

    private String roundTrip(final String value) {
        try {
            final byte[] request = (value + "\n").getBytes(StandardCharsets.UTF_8);
            out.write(request);
            out.flush();
            line.reset();
            while (true) {
                final int b = in.read();
                if (b < 0) {
                    throw new IOException("echo server closed the connection");
                }
                if (b == '\n') {
                    return line.toString(StandardCharsets.UTF_8);
                }
                line.write(b);
            }
        } catch (final IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
