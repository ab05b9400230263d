import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;

// java Minimal.java http://127.0.0.1:8010 MODEL   (JDK 17+, no libraries)
public class Minimal {
    public static void main(String[] args) throws Exception {
        String base = args[0], model = args[1];
        HttpClient client = HttpClient.newHttpClient();
        String chat = post(client, base + "/v1/chat/completions", "{\"model\": \"" + model + "\", \"max_tokens\": 32,"
                + " \"messages\": [{\"role\": \"user\", \"content\": \"What is 2 + 2?\"}]}");
        String id = chat.replaceAll("(?s)^\\{\\s*\"id\"\\s*:\\s*\"([^\"]+)\".*", "$1");  // the response's id comes first
        System.out.println(chat);
        System.out.println(post(client, base + "/feedback", "{\"msg_ids\": [\"" + id + "\"], \"reward\": 1.0}"));
        System.out.println(post(client, base + "/commit", "{}"));
    }

    static String post(HttpClient client, String url, String json) throws Exception {
        HttpRequest req = HttpRequest.newBuilder(URI.create(url)).header("Content-Type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(json)).build();
        HttpResponse<String> resp = client.send(req, HttpResponse.BodyHandlers.ofString());
        if (resp.statusCode() != 200) throw new IllegalStateException(url + ": HTTP " + resp.statusCode() + ": " + resp.body());
        return resp.body();
    }
}
