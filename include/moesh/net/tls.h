// TLS on any ByteStream (OpenSSL over memory BIOs), with certificate pinning instead of a CA.
//
// Workers hold a certificate and key (`--tls-cert`, `--tls-key`; self-signed is the normal case)
// and are always the TLS server; backbones are the client and accept only certificates whose
// SHA-256 fingerprint they were given (`--tls-pin`), so no CA is involved and a relay or anyone
// else on the path can neither read the traffic nor stand in for a worker. TLS starts right after
// the TCP connection (after the ROUTE frames on joined and relayed connections, docs/PROTOCOL.md),
// so HELLO, the swarm-key exchange and every request travel inside it. TLS 1.3 only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moesh/net/transport.h"
#include "moesh/util/status.h"

namespace moesh::net {

// A certificate and its private key (PEM files), loaded once; shared by every connection.
class TlsIdentity {
 public:
  // kInvalidArgument naming the file when either does not load or they do not match.
  static Result<std::shared_ptr<const TlsIdentity>> load(const std::string& cert_file, const std::string& key_file);
  ~TlsIdentity();
  const std::string& fingerprint() const { return fingerprint_; }  // SHA-256 of the DER certificate, hex
  void* ctx() const { return ctx_; }                               // SSL_CTX*

 private:
  TlsIdentity() = default;
  void* ctx_ = nullptr;
  std::string fingerprint_;
};

// The fingerprints a backbone accepts: 64 hex digits each, case and ':' ignored.
struct TlsPins {
  std::vector<std::string> sha256;  // normalized: lowercase hex, no ':'
  static Result<TlsPins> parse(const std::vector<std::string>& pins);
  bool allows(const std::string& fingerprint) const;
  bool empty() const { return sha256.empty(); }
};

// Runs the TLS handshake over `inner` as server (worker) or client (backbone, checking the pins)
// before the deadline, and returns the encrypted stream. Errors say what failed and, for the
// usual mistake, what to change (a peer that does not speak TLS, a fingerprint not pinned).
Result<std::unique_ptr<ByteStream>> tls_server(std::unique_ptr<ByteStream> inner, const TlsIdentity& id,
                                               Deadline deadline);
Result<std::unique_ptr<ByteStream>> tls_client(std::unique_ptr<ByteStream> inner, const TlsPins& pins,
                                               Deadline deadline);

// Reads frames from a raw stream with exact reads (never past the frame), so the stream can be
// handed on afterwards (to TLS, a Connection, a splice); a timeout keeps what was read and the
// next call resumes. The ROUTE exchange before a connection's handshake uses it.
class FrameReader {
 public:
  Result<wire::Frame> read(ByteStream& s, Deadline deadline, uint32_t max_payload = wire::kDefaultMaxFrameBytes);
  const std::vector<uint8_t>& last_bytes() const { return last_; }  // the last complete frame, as received
  // Bytes read of a frame not complete, or that failed to parse as a frame header (a relay hands
  // them on as they are when what follows is not frames, e.g. TLS).
  std::span<const uint8_t> pending() const { return std::span<const uint8_t>(raw_.data(), have_); }

 private:
  std::vector<uint8_t> raw_;
  size_t have_ = 0;
  wire::FrameHeader header_;
  std::vector<uint8_t> last_;
};

}  // namespace moesh::net
