// What the CLI's HTTP clients of a gateway share (`moesh swarm`, `moesh span --fetch`): the base
// URL httplib takes, and the message of an OpenAI-style error body.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace moesh::cli {

// "http://host:port[/...]" or "host:port" -> "http://host:port".
inline std::string base_url(std::string u) {
  if (u.rfind("http://", 0) != 0 && u.rfind("https://", 0) != 0) u = "http://" + u;
  const size_t slash = u.find('/', u.find("//") + 2);
  return slash == std::string::npos ? u : u.substr(0, slash);
}

// {"error": {"message": M}} -> M; any other body as it is.
inline std::string api_error_message(const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string())
    return j["error"]["message"].get<std::string>();
  return body;
}

}  // namespace moesh::cli
