// TLS over ByteStreams (net/tls.h), over the in-process loopback: a pinned handshake carries
// frames both ways (large ones too, from two threads at once); a certificate not pinned, a peer
// that does not speak TLS, a key that does not match its certificate and malformed pins are all
// refused with a message saying what to change. FrameReader resumes across timeouts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <future>
#include <thread>

#include "moesh/net/tls.h"
#include "net/net_test_util.h"

namespace moesh::net {
namespace {

using std::chrono::milliseconds;

// A self-signed certificate made with the openssl tool (Debian's `openssl` package).
struct CertFiles {
  std::string cert, key;
  bool ok = false;
};
CertFiles make_cert(const std::string& tag) {
  CertFiles c;
  const std::string dir = ::testing::TempDir();
  c.cert = dir + "/moesh-tls-" + tag + "-" + std::to_string(getpid()) + ".crt";
  c.key = dir + "/moesh-tls-" + tag + "-" + std::to_string(getpid()) + ".key";
  const std::string cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=" + tag +
                          " -days 2 -keyout '" + c.key + "' -out '" + c.cert + "' >/dev/null 2>&1";
  c.ok = std::system(cmd.c_str()) == 0;
  return c;
}

struct Pair {
  Result<std::unique_ptr<ByteStream>> server = Status(StatusCode::kInternal, "");
  Result<std::unique_ptr<ByteStream>> client = Status(StatusCode::kInternal, "");
};
Pair handshake(const TlsIdentity& id, const TlsPins& pins) {
  auto [a, b] = make_loopback_streams();
  Pair p;
  std::thread s(
      [&, a = std::move(a)]() mutable { p.server = tls_server(std::move(a), id, deadline_in(milliseconds(5000))); });
  p.client = tls_client(std::move(b), pins, deadline_in(milliseconds(5000)));
  s.join();
  return p;
}

TEST(Tls, PinnedHandshakeCarriesFramesBothWays) {
  const CertFiles c = make_cert("w1");
  if (!c.ok) GTEST_SKIP() << "the openssl tool is missing (scripts/install-deps.sh installs it)";
  auto id = TlsIdentity::load(c.cert, c.key);
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  EXPECT_EQ((*id)->fingerprint().size(), 64u);
  auto pins = TlsPins::parse({(*id)->fingerprint()});
  ASSERT_TRUE(pins.is_ok());
  Pair p = handshake(**id, *pins);
  ASSERT_TRUE(p.server.is_ok()) << p.server.status().to_string();
  ASSERT_TRUE(p.client.is_ok()) << p.client.status().to_string();
  EXPECT_EQ((*p.client)->describe().rfind("tls ", 0), 0u);
  auto cs = make_stream_connection(std::move(*p.client));
  auto ss = make_stream_connection(std::move(*p.server));
  // Both directions at once, frames up to 3 MB (several TLS records each).
  std::vector<std::vector<uint8_t>> frames;
  for (size_t n : {0u, 1u, 100u, 16384u, 3000000u}) {
    std::vector<uint8_t> payload(n);
    for (size_t i = 0; i < n; ++i) payload[i] = static_cast<uint8_t>(i * 31 + n);
    frames.push_back(wire::build_frame(wire::MsgType::kPing, frames.size() + 1, payload));
  }
  auto send_all = [&](Connection& c) {
    for (const auto& f : frames) ASSERT_TRUE(c.send_frame(f, deadline_in(milliseconds(10000))).is_ok());
  };
  auto recv_all = [&](Connection& c) {
    for (size_t i = 0; i < frames.size(); ++i) {
      auto f = c.recv_frame(deadline_in(milliseconds(10000)));
      ASSERT_TRUE(f.is_ok()) << f.status().to_string();
      EXPECT_EQ(f->request_id(), i + 1);
      EXPECT_EQ(f->payload.size() + wire::kHeaderBytes, frames[i].size());
      EXPECT_TRUE(std::equal(f->payload.begin(), f->payload.end(), frames[i].begin() + wire::kHeaderBytes));
    }
  };
  std::thread t1([&] { send_all(*cs); });
  std::thread t2([&] { send_all(*ss); });
  std::thread t3([&] { recv_all(*cs); });
  recv_all(*ss);
  t1.join();
  t2.join();
  t3.join();
}

TEST(Tls, UnpinnedCertificatePlainPeersAndBadFilesAreRefused) {
  const CertFiles c = make_cert("w2"), other = make_cert("w3");
  if (!c.ok || !other.ok) GTEST_SKIP() << "the openssl tool is missing";
  auto id = TlsIdentity::load(c.cert, c.key);
  auto id2 = TlsIdentity::load(other.cert, other.key);
  ASSERT_TRUE(id.is_ok() && id2.is_ok());
  // Pinned to another certificate: the client refuses, naming the fingerprint it saw.
  Pair p = handshake(**id, *TlsPins::parse({(*id2)->fingerprint()}));
  ASSERT_FALSE(p.client.is_ok());
  EXPECT_EQ(p.client.status().code(), StatusCode::kUnauthenticated);
  EXPECT_NE(p.client.status().message().find("is not pinned; add --tls-pin " + (*id)->fingerprint()), std::string::npos)
      << p.client.status().to_string();
  // A client that sends frames instead of TLS: the server's handshake fails and says why.
  {
    auto [a, b] = make_loopback_streams();
    std::thread plain([b = std::move(b)]() mutable {
      auto f = wire::build_frame(wire::MsgType::kPing, 1, std::vector<uint8_t>(16));
      (void)b->write_all(f, deadline_in(milliseconds(2000)));
      uint8_t buf[64];
      (void)b->read_some(buf, deadline_in(milliseconds(2000)));
      b->close();
    });
    auto s = tls_server(std::move(a), **id, deadline_in(milliseconds(3000)));
    plain.join();
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.status().message().find("is the backbone started with --tls-pin?"), std::string::npos)
        << s.status().to_string();
  }
  // A TLS client facing a plain server (it answers with a frame, then closes).
  {
    auto [a, b] = make_loopback_streams();
    std::thread plain([a = std::move(a)]() mutable {
      uint8_t buf[512];
      (void)a->read_some(buf, deadline_in(milliseconds(2000)));
      auto e = wire::encode_error({.request_id = 0, .code = 1, .text = "bad magic"});
      (void)a->write_all(*e, deadline_in(milliseconds(2000)));
      a->close();
    });
    auto cl = tls_client(std::move(b), *TlsPins::parse({(*id)->fingerprint()}), deadline_in(milliseconds(3000)));
    plain.join();
    ASSERT_FALSE(cl.is_ok());
    EXPECT_NE(cl.status().message().find("does the worker run with --tls-cert/--tls-key?"), std::string::npos)
        << cl.status().to_string();
  }
  // Files: a key of another certificate, a missing file, pins that are not SHA-256 hex.
  auto mixed = TlsIdentity::load(c.cert, other.key);
  ASSERT_FALSE(mixed.is_ok());
  EXPECT_NE(mixed.status().message().find("does not belong to --tls-cert"), std::string::npos);
  auto missing = TlsIdentity::load("/nonexistent/cert.pem", c.key);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("--tls-cert '/nonexistent/cert.pem'"), std::string::npos);
  EXPECT_FALSE(TlsPins::parse({"abc"}).is_ok());
  EXPECT_FALSE(TlsPins::parse({std::string(64, 'g')}).is_ok());
  auto colons = TlsPins::parse({"AB:" + std::string(62, 'c')});
  ASSERT_TRUE(colons.is_ok());
  EXPECT_TRUE(colons->allows("ab" + std::string(62, 'c')));
}

TEST(FrameReaderTest, ResumesAcrossTimeoutsAndNeverReadsPastTheFrame) {
  auto [a, b] = make_loopback_streams();
  const auto f1 = wire::build_frame(wire::MsgType::kPing, 7, std::vector<uint8_t>(40, 1));
  const auto f2 = wire::build_frame(wire::MsgType::kPing, 8, std::vector<uint8_t>(3, 2));
  FrameReader r;
  ASSERT_TRUE(b->write_all(std::span<const uint8_t>(f1.data(), 10), deadline_in(milliseconds(1000))).is_ok());
  auto t = r.read(*a, deadline_in(milliseconds(20)));
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), StatusCode::kTimeout);
  std::vector<uint8_t> rest(f1.begin() + 10, f1.end());
  rest.insert(rest.end(), f2.begin(), f2.end());
  ASSERT_TRUE(b->write_all(rest, deadline_in(milliseconds(1000))).is_ok());
  auto g1 = r.read(*a, deadline_in(milliseconds(1000)));
  ASSERT_TRUE(g1.is_ok()) << g1.status().to_string();
  EXPECT_EQ(g1->request_id(), 7u);
  EXPECT_EQ(r.last_bytes(), f1);
  // The second frame is still in the stream, untouched: a Connection can take it from here.
  auto conn = make_stream_connection(std::move(a));
  auto g2 = conn->recv_frame(deadline_in(milliseconds(1000)));
  ASSERT_TRUE(g2.is_ok());
  EXPECT_EQ(g2->request_id(), 8u);
}

}  // namespace
}  // namespace moesh::net
