// OpenAI-style errors: {"error":{"message","type","param","code"}} with the HTTP status they travel
// with. One definition shared by request parsing, the routes and the SSE writer, so every failure a
// client can see has the same shape (vLLM's and OpenAI's).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/request.h"

namespace mla::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // OpenAI's error types: invalid_request_error, ...
  std::string param;                           // "" -> JSON null
  std::string code;                            // "" -> JSON null
  int retry_after_s = 0;                       // > 0: sent as Retry-After (429, 503)

  nlohmann::json to_json() const;
  std::string body() const;  // to_json() serialized (invalid UTF-8 replaced, never throws)
};

ApiError bad_param(const std::string& param, const std::string& message);
// Maps the engine's submit errors: InvalidParam / ContextLengthExceeded -> 400, QueueFull -> 429
// (Retry-After), ShuttingDown / EngineDead -> 503.
ApiError from_engine_error(const runtime::EngineError& e);

// Serializes JSON that may carry model text: invalid UTF-8 becomes U+FFFD instead of throwing.
std::string dump_json(const nlohmann::json& j);

}  // namespace mla::server
