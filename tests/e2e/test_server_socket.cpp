// The server's accepted connections carry TCP_NODELAY (small SSE chunks must not wait for Nagle plus
// delayed ACK). In-process: a Server still loading answers /health with 503 over a kept-alive
// connection; the accepted socket is then found among this process's fds by its (local, peer) ports.
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "server/http_server.h"
#include "e2e/test_server_util.h"

namespace mla::test {
namespace {

int port_of(const sockaddr_storage& a) {
  return a.ss_family == AF_INET ? ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port) : -1;
}

TEST(ServerSocket, AcceptedConnectionsHaveTcpNodelay) {
  server::ServerOptions opt;
  opt.port = 0;
  server::Server srv(opt);
  ASSERT_TRUE(srv.start(1).is_ok());
  const int client = connect_local(srv.port());
  ASSERT_GE(client, 0);
  ASSERT_TRUE(send_all(client, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  char buf[512];
  ASSERT_GT(recv(client, buf, sizeof(buf), 0), 0);  // answered: the server side is accepted
  sockaddr_storage mine{};
  socklen_t ml = sizeof(mine);
  ASSERT_EQ(getsockname(client, reinterpret_cast<sockaddr*>(&mine), &ml), 0);
  int found = 0, nodelay = -1;
  DIR* d = opendir("/proc/self/fd");
  ASSERT_NE(d, nullptr);
  while (dirent* e = readdir(d)) {
    const int fd = std::atoi(e->d_name);
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (fd == client || getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0)
      continue;
    if (port_of(local) != srv.port() || port_of(peer) != port_of(mine)) continue;
    socklen_t n = sizeof(nodelay);
    ASSERT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &n), 0);
    ++found;
  }
  closedir(d);
  close(client);
  srv.stop();
  ASSERT_EQ(found, 1);
  EXPECT_EQ(nodelay, 1);
}

}  // namespace
}  // namespace mla::test
