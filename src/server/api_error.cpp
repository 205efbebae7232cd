// OpenAI error bodies and the engine-error -> HTTP status mapping (see api_error.h).
#include "server/api_error.h"

namespace mla::server {

nlohmann::json ApiError::to_json() const {
  nlohmann::json e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? nlohmann::json() : nlohmann::json(param);
  e["code"] = code.empty() ? nlohmann::json() : nlohmann::json(code);
  return nlohmann::json{{"error", e}};
}

std::string ApiError::body() const { return dump_json(to_json()); }

std::string dump_json(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

ApiError bad_param(const std::string& param, const std::string& message) {
  return ApiError{400, message, "invalid_request_error", param, ""};
}

ApiError from_engine_error(const runtime::EngineError& e) {
  switch (e.code) {
    case runtime::ErrorCode::InvalidParam: return bad_param(e.param, e.message);
    case runtime::ErrorCode::ContextLengthExceeded:
      return ApiError{400, e.message, "invalid_request_error", e.param, "context_length_exceeded"};
    case runtime::ErrorCode::QueueFull:
      return ApiError{429, e.message.empty() ? "the request queue is full; retry later" : e.message,
                      "rate_limit_exceeded", "", "queue_full", 1};
    case runtime::ErrorCode::ShuttingDown:
      return ApiError{503, "the server is shutting down", "service_unavailable", "", "shutting_down", 0};
    case runtime::ErrorCode::EngineDead:
      return ApiError{503, "the engine failed: " + e.message, "service_unavailable", "", "engine_dead", 0};
  }
  return ApiError{500, e.message, "internal_error", "", ""};
}

}  // namespace mla::server
