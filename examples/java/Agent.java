// A plain-JDK agent for Trinity's OpenAI-compatible endpoint (rftstack serve): no libraries, the
// JDK's default java.net.http.HttpClient. Each agent (one thread) runs chat completions, one
// streamed chat completion, POST /feedback with the ids it got back, then POST /commit.
//
//   javac --release 17 -d classes Agent.java
//   java -cp classes Agent http://127.0.0.1:8010 [--agents 8] [--chats 4] [--http1] [--model NAME]
//
// --http1 forces HTTP/1.1; without it the client is left at its default (HTTP/2, which on a
// cleartext URL offers an h2c upgrade on each request). Prints one JSON line: requests ok and
// failed, every msg id the endpoint returned, the failures; exits 1 on any failure.
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.stream.Collectors;

public final class Agent {
    static final Duration TIMEOUT = Duration.ofSeconds(300);

    /** What one agent did. */
    static final class Result {
        int ok;
        int failed;
        final List<String> msgIds = new ArrayList<>();
        final List<String> failures = new ArrayList<>();
        int rewarded;

        void fail(String what) {
            failed++;
            failures.add(what);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1 || args[0].startsWith("-")) {
            System.err.println("usage: java Agent BASE_URL [--agents N] [--chats N] [--http1] [--model NAME]");
            System.exit(2);
        }
        String base = args[0].replaceAll("/+$", "");
        int agents = 1, chats = 4;
        boolean http1 = false;
        String model = null;
        for (int i = 1; i < args.length; i++) {
            switch (args[i]) {
                case "--agents": agents = Integer.parseInt(args[++i]); break;
                case "--chats": chats = Integer.parseInt(args[++i]); break;
                case "--http1": http1 = true; break;
                case "--model": model = args[++i]; break;
                default:
                    System.err.println("Agent: unknown option " + args[i] + "; see the usage at the top of Agent.java");
                    System.exit(2);
            }
        }
        HttpClient.Builder builder = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(10));
        // the defaults are what HttpClient.newHttpClient() gives; --http1 is the one change
        HttpClient client = http1 ? builder.version(HttpClient.Version.HTTP_1_1).build() : HttpClient.newHttpClient();
        Result all = new Result();
        if (model == null) {
            try {
                model = firstModel(client, base);
            } catch (Exception e) {
                all.fail("GET /v1/models: " + e);
            }
        }
        if (model != null) {
            final String m = model;
            final int n = chats;
            ExecutorService pool = Executors.newFixedThreadPool(agents);
            List<Future<Result>> futures = new ArrayList<>();
            for (int k = 0; k < agents; k++) {
                final int id = k;
                futures.add(pool.submit(() -> runAgent(client, base, m, id, n)));
            }
            for (Future<Result> f : futures) {
                Result r = f.get();
                all.ok += r.ok;
                all.failed += r.failed;
                all.rewarded += r.rewarded;
                all.msgIds.addAll(r.msgIds);
                all.failures.addAll(r.failures);
            }
            pool.shutdown();
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("agents", agents);
        out.put("http", http1 ? "HTTP/1.1 (forced)" : "default (" + client.version() + ")");
        out.put("model", model);
        out.put("requests_ok", all.ok);
        out.put("requests_failed", all.failed);
        out.put("rewarded", all.rewarded);
        out.put("msg_ids", all.msgIds);
        out.put("failures", all.failures);
        System.out.println(Json.write(out));
        System.exit(all.failed == 0 ? 0 : 1);
    }

    static String firstModel(HttpClient client, String base) throws Exception {
        HttpResponse<String> r = client.send(HttpRequest.newBuilder(URI.create(base + "/v1/models")).timeout(TIMEOUT).GET().build(),
                HttpResponse.BodyHandlers.ofString());
        if (r.statusCode() != 200) throw new IllegalStateException("HTTP " + r.statusCode() + ": " + r.body());
        Object data = ((Map<?, ?>) Json.parse(r.body())).get("data");
        return (String) ((Map<?, ?>) ((List<?>) data).get(0)).get("id");
    }

    static HttpRequest post(String url, String json) {
        return HttpRequest.newBuilder(URI.create(url)).timeout(TIMEOUT).header("Content-Type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(json)).build();
    }

    static String chatBody(String model, String prompt, boolean stream) {
        Map<String, Object> msg = new LinkedHashMap<>();
        msg.put("role", "user");
        msg.put("content", prompt);
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("model", model);
        body.put("messages", List.of(msg));
        body.put("max_tokens", 16);
        body.put("stream", stream);
        return Json.write(body);
    }

    static Result runAgent(HttpClient client, String base, String model, int agent, int chats) {
        Result r = new Result();
        String task = "agent-" + agent + "-" + UUID.randomUUID();
        for (int i = 0; i < chats; i++) {
            try {
                HttpResponse<String> resp = client.send(post(base + "/v1/chat/completions",
                        chatBody(model, "agent " + agent + " question " + i + ": what is " + i + " + " + agent + "?", false)),
                        HttpResponse.BodyHandlers.ofString());
                Object id = resp.statusCode() == 200 ? ((Map<?, ?>) Json.parse(resp.body())).get("id") : null;
                if (id instanceof String) {
                    r.ok++;
                    r.msgIds.add((String) id);
                } else {
                    r.fail("chat " + agent + "/" + i + ": HTTP " + resp.statusCode() + ": " + resp.body());
                }
            } catch (Exception e) {
                r.fail("chat " + agent + "/" + i + ": " + e);
            }
        }
        try {  // one streamed chat: server-sent events, "data: {...}" lines, then "data: [DONE]"
            HttpResponse<java.util.stream.Stream<String>> resp = client.send(post(base + "/v1/chat/completions",
                    chatBody(model, "agent " + agent + " streams", true)), HttpResponse.BodyHandlers.ofLines());
            List<String> lines = resp.body().collect(Collectors.toList());
            List<String> events = lines.stream().filter(l -> l.startsWith("data:")).map(l -> l.substring(5).trim())
                    .collect(Collectors.toList());
            String id = null;
            for (String e : events) {
                if (!e.equals("[DONE]")) {
                    Map<?, ?> chunk = (Map<?, ?>) Json.parse(e);
                    if (chunk.get("error") != null) throw new IllegalStateException("error event: " + e);
                    if (chunk.get("id") instanceof String) id = (String) chunk.get("id");
                }
            }
            if (resp.statusCode() == 200 && id != null && !events.isEmpty() && events.get(events.size() - 1).equals("[DONE]")) {
                r.ok++;
                r.msgIds.add(id);
            } else {
                r.fail("stream " + agent + ": HTTP " + resp.statusCode() + ": " + String.join("\n", lines));
            }
        } catch (Exception e) {
            r.fail("stream " + agent + ": " + e);
        }
        if (!r.msgIds.isEmpty()) {
            try {  // Trinity's /feedback: the ids of the responses, one reward, the task they belong to
                Map<String, Object> fb = new LinkedHashMap<>();
                fb.put("msg_ids", r.msgIds);
                fb.put("reward", 1.0);
                fb.put("task_id", task);
                fb.put("run_id", 0);
                HttpResponse<String> resp = client.send(post(base + "/feedback", Json.write(fb)), HttpResponse.BodyHandlers.ofString());
                Object updated = resp.statusCode() == 200 ? ((Map<?, ?>) Json.parse(resp.body())).get("updated") : null;
                if (resp.statusCode() == 200) {
                    r.ok++;
                    r.rewarded += updated instanceof Number ? ((Number) updated).intValue() : r.msgIds.size();
                } else {
                    r.fail("feedback " + agent + ": HTTP " + resp.statusCode() + ": " + resp.body());
                }
            } catch (Exception e) {
                r.fail("feedback " + agent + ": " + e);
            }
        }
        try {
            HttpResponse<String> resp = client.send(post(base + "/commit", "{}"), HttpResponse.BodyHandlers.ofString());
            if (resp.statusCode() == 200) r.ok++;
            else r.fail("commit " + agent + ": HTTP " + resp.statusCode() + ": " + resp.body());
        } catch (Exception e) {
            r.fail("commit " + agent + ": " + e);
        }
        return r;
    }

    /** The little JSON this agent needs: objects, arrays, strings, numbers, true/false/null. */
    static final class Json {
        private final String s;
        private int i;

        private Json(String s) {
            this.s = s;
        }

        static Object parse(String text) {
            Json p = new Json(text);
            Object v = p.value();
            p.ws();
            if (p.i != text.length()) throw new IllegalArgumentException("trailing data at " + p.i);
            return v;
        }

        private void ws() {
            while (i < s.length() && Character.isWhitespace(s.charAt(i))) i++;
        }

        private Object value() {
            ws();
            char c = s.charAt(i);
            if (c == '{') {
                Map<String, Object> m = new LinkedHashMap<>();
                i++;
                ws();
                if (s.charAt(i) == '}') { i++; return m; }
                while (true) {
                    ws();
                    String k = string();
                    ws();
                    expect(':');
                    m.put(k, value());
                    ws();
                    if (s.charAt(i) == ',') { i++; continue; }
                    expect('}');
                    return m;
                }
            }
            if (c == '[') {
                List<Object> l = new ArrayList<>();
                i++;
                ws();
                if (s.charAt(i) == ']') { i++; return l; }
                while (true) {
                    l.add(value());
                    ws();
                    if (s.charAt(i) == ',') { i++; continue; }
                    expect(']');
                    return l;
                }
            }
            if (c == '"') return string();
            if (s.startsWith("true", i)) { i += 4; return Boolean.TRUE; }
            if (s.startsWith("false", i)) { i += 5; return Boolean.FALSE; }
            if (s.startsWith("null", i)) { i += 4; return null; }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            if (start == i) throw new IllegalArgumentException("unexpected '" + c + "' at " + i);
            return Double.parseDouble(s.substring(start, i));
        }

        private void expect(char c) {
            if (s.charAt(i) != c) throw new IllegalArgumentException("expected '" + c + "' at " + i);
            i++;
        }

        private String string() {
            expect('"');
            StringBuilder b = new StringBuilder();
            while (true) {
                char c = s.charAt(i++);
                if (c == '"') return b.toString();
                if (c != '\\') { b.append(c); continue; }
                char e = s.charAt(i++);
                switch (e) {
                    case 'n': b.append('\n'); break;
                    case 't': b.append('\t'); break;
                    case 'r': b.append('\r'); break;
                    case 'b': b.append('\b'); break;
                    case 'f': b.append('\f'); break;
                    case 'u': b.append((char) Integer.parseInt(s.substring(i, i + 4), 16)); i += 4; break;
                    default: b.append(e);
                }
            }
        }

        static String write(Object v) {
            if (v == null) return "null";
            if (v instanceof String) {
                StringBuilder b = new StringBuilder("\"");
                for (char c : ((String) v).toCharArray()) {
                    if (c == '"' || c == '\\') b.append('\\').append(c);
                    else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
                }
                return b.append('"').toString();
            }
            if (v instanceof Map) {
                return ((Map<?, ?>) v).entrySet().stream().map(e -> write(String.valueOf(e.getKey())) + ":" + write(e.getValue()))
                        .collect(Collectors.joining(",", "{", "}"));
            }
            if (v instanceof List) {
                return ((List<?>) v).stream().map(Json::write).collect(Collectors.joining(",", "[", "]"));
            }
            return String.valueOf(v);
        }
    }
}
