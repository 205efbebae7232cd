// Helpers for the server end-to-end tests: start `mlaserve serve` as a child process on a free
// loopback port, talk raw HTTP/1.1 over a socket (so malformed and oversized requests can be sent
// byte for byte), and read Prometheus values out of /metrics.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace mla::test {

inline std::string default_model_dir() { return std::string(MLA_FIXTURE_DIR) + "/../../models/default"; }

struct HttpReply {
  int status = 0;  // 0: no reply (connection failed or closed early)
  std::map<std::string, std::string> headers;  // lower-cased names
  std::string body;                            // de-chunked
  std::string raw;
};

inline std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

inline int connect_local(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

inline void parse_reply(HttpReply& r) {
  const size_t he = r.raw.find("\r\n\r\n");
  if (he == std::string::npos || r.raw.compare(0, 5, "HTTP/") != 0) return;
  r.status = std::atoi(r.raw.c_str() + r.raw.find(' ') + 1);
  size_t pos = r.raw.find("\r\n") + 2;
  while (pos < he) {
    const size_t eol = r.raw.find("\r\n", pos);
    const std::string line = r.raw.substr(pos, eol - pos);
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string v = line.substr(colon + 1);
      while (!v.empty() && v.front() == ' ') v.erase(v.begin());
      r.headers[lower(line.substr(0, colon))] = v;
    }
    pos = eol + 2;
  }
  std::string body = r.raw.substr(he + 4);
  if (lower(r.headers["transfer-encoding"]) == "chunked") {
    std::string out;
    size_t p = 0;
    while (p < body.size()) {
      const size_t eol = body.find("\r\n", p);
      if (eol == std::string::npos) break;
      const size_t n = std::strtoul(body.substr(p, eol - p).c_str(), nullptr, 16);
      if (n == 0) break;
      out += body.substr(eol + 2, n);
      p = eol + 2 + n + 2;
    }
    body = out;
  }
  r.body = body;
}

// True once `raw` holds a complete response (headers + Content-Length body or a final chunk).
inline bool reply_complete(const std::string& raw) {
  const size_t he = raw.find("\r\n\r\n");
  if (he == std::string::npos) return false;
  const std::string head = lower(raw.substr(0, he));
  const size_t cl = head.find("content-length:");
  if (cl != std::string::npos) return raw.size() >= he + 4 + std::strtoul(head.c_str() + cl + 15, nullptr, 10);
  if (head.find("chunked") != std::string::npos) return raw.size() >= 5 && raw.compare(raw.size() - 5, 5, "0\r\n\r\n") == 0;
  return false;
}

// Sends `request` verbatim and reads one response.
inline HttpReply raw_http(int port, const std::string& request) {
  HttpReply r;
  const int fd = connect_local(port);
  if (fd < 0) return r;
  send_all(fd, request);  // the server may answer (and close) before reading an oversized request
  char buf[16384];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    r.raw.append(buf, size_t(n));
    if (reply_complete(r.raw)) break;
  }
  close(fd);
  parse_reply(r);
  return r;
}

inline std::string http_request(const std::string& method, const std::string& path, const std::string& body,
                                const std::string& api_key, const std::string& extra_headers = "") {
  std::string req = fmt::format("{} {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n", method, path);
  if (!api_key.empty()) req += "Authorization: Bearer " + api_key + "\r\n";
  if (!body.empty() || method == "POST")
    req += fmt::format("Content-Type: application/json\r\nContent-Length: {}\r\n", body.size());
  req += extra_headers + "\r\n" + body;
  return req;
}

inline HttpReply http(int port, const std::string& method, const std::string& path, const std::string& body = "",
                      const std::string& api_key = "") {
  return raw_http(port, http_request(method, path, body, api_key));
}

// A `mlaserve serve` child process. The constructor returns once /health answered 200 (or failed).
class ServerProcess {
 public:
  // wait_ready = false: return as soon as the port is known (the model may still be loading).
  ServerProcess(const std::string& extra_args, const std::string& api_key = "", bool wait_ready = true)
      : api_key_(api_key) {
    int out[2];
    if (pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      close(out[0]);
      close(out[1]);
      const std::string cmd = fmt::format("exec {} serve --model {} --port 0 {} {}", MLA_BINARY, default_model_dir(),
                                          api_key.empty() ? "" : "--api-key " + api_key, extra_args);
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    out_ = fdopen(out[0], "r");
    // "mlaserve: listening on http://127.0.0.1:PORT ..."
    char line[1024];
    while (out_ && std::fgets(line, sizeof(line), out_)) {
      log_ += line;
      if (const char* p = std::strstr(line, "listening on http://")) {
        const char* colon = std::strchr(p + 20, ':');
        if (colon) port_ = std::atoi(colon + 1);
        if (!wait_ready) break;
      }
      if (std::strstr(line, "ready") || std::strstr(line, "stopped")) break;
    }
    // Keep draining stdout so the child never blocks on a full pipe.
    reader_ = std::thread([this] {
      char l[1024];
      while (out_ && std::fgets(l, sizeof(l), out_)) {
      }
    });
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      wait_exit();
    }
    if (reader_.joinable()) reader_.join();
    if (out_) fclose(out_);
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& log() const { return log_; }
  const std::string& key() const { return api_key_; }
  // The exit status (-1: killed by a signal), waiting at most `timeout`.
  std::optional<int> wait_exit(std::chrono::seconds timeout = std::chrono::seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      const pid_t r = waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return std::nullopt;
  }

 private:
  std::string api_key_;
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  int port_ = -1;
  std::string log_;
  std::thread reader_;
};

// The value of the first sample of `name` in a Prometheus text body (nullopt if absent).
inline std::optional<double> metric(const std::string& text, const std::string& name) {
  size_t pos = 0;
  while ((pos = text.find(name, pos)) != std::string::npos) {
    const bool line_start = pos == 0 || text[pos - 1] == '\n';
    const char after = pos + name.size() < text.size() ? text[pos + name.size()] : '\0';
    if (line_start && (after == '{' || after == ' ')) {
      const size_t eol = std::min(text.find('\n', pos), text.size());
      const size_t sp = text.rfind(' ', eol);
      return std::strtod(text.c_str() + sp + 1, nullptr);
    }
    pos += name.size();
  }
  return std::nullopt;
}

}  // namespace mla::test
