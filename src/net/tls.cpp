// TLS over a ByteStream with memory BIOs (net/tls.h). The SSL object is used under one lock; the
// reader waits for the inner stream without it, so a writer is never blocked by a pending read.
// Encrypted bytes leave in the order OpenSSL produced them: whoever drains the write BIO holds
// the write lock until they are on the inner stream.
#include "moesh/net/tls.h"

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cctype>
#include <mutex>

namespace moesh::net {

namespace {

std::string ssl_errors() {
  std::string s;
  unsigned long e;
  while ((e = ERR_get_error()) != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!s.empty()) s += "; ";
    s += buf;
  }
  return s.empty() ? std::string("no detail") : s;
}

std::string cert_fingerprint(X509* cert) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (X509_digest(cert, EVP_sha256(), md, &n) != 1) return "";
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

SSL_CTX* client_ctx() {
  // One context for every client connection: no CA store, the pins decide (after the handshake).
  static SSL_CTX* ctx = [] {
    SSL_CTX* c = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION);
    SSL_CTX_set_verify(c, SSL_VERIFY_NONE, nullptr);
    return c;
  }();
  return ctx;
}

class TlsStream final : public ByteStream {
 public:
  TlsStream(std::unique_ptr<ByteStream> inner, SSL* ssl) : inner_(std::move(inner)), ssl_(ssl) {
    rbio_ = BIO_new(BIO_s_mem());
    wbio_ = BIO_new(BIO_s_mem());
    SSL_set_bio(ssl_, rbio_, wbio_);  // ssl_ owns both now
  }
  ~TlsStream() override {
    close();
    SSL_free(ssl_);
  }

  Status handshake(Deadline deadline) {
    for (;;) {
      int r, err;
      {
        std::lock_guard<std::mutex> lk(ssl_mu_);
        ERR_clear_error();
        r = SSL_do_handshake(ssl_);
        err = r == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl_, r);
      }
      MOESH_RETURN_IF_ERROR(flush(deadline));
      if (r == 1) return Status::ok();
      if (err != SSL_ERROR_WANT_READ) return tls_error("handshake", err);
      MOESH_RETURN_IF_ERROR(pull(deadline));
    }
  }

  std::string peer_fingerprint() {
    std::lock_guard<std::mutex> lk(ssl_mu_);
    X509* cert = SSL_get1_peer_certificate(ssl_);
    if (cert == nullptr) return "";
    std::string fp = cert_fingerprint(cert);
    X509_free(cert);
    return fp;
  }

  Status write_all(std::span<const uint8_t> bytes, Deadline deadline) override {
    size_t off = 0;
    while (off < bytes.size()) {
      int r, err = SSL_ERROR_NONE;
      {
        std::lock_guard<std::mutex> lk(ssl_mu_);
        ERR_clear_error();
        r = SSL_write(ssl_, bytes.data() + off, static_cast<int>(std::min<size_t>(bytes.size() - off, 1 << 20)));
        if (r <= 0) err = SSL_get_error(ssl_, r);
      }
      MOESH_RETURN_IF_ERROR(flush(deadline));
      if (r <= 0) return tls_error("write", err);
      off += static_cast<size_t>(r);
    }
    return Status::ok();
  }

  Result<size_t> read_some(std::span<uint8_t> buf, Deadline deadline) override {
    std::lock_guard<std::mutex> one_reader(read_mu_);
    for (;;) {
      int r, err = SSL_ERROR_NONE;
      {
        std::lock_guard<std::mutex> lk(ssl_mu_);
        ERR_clear_error();
        r = SSL_read(ssl_, buf.data(), static_cast<int>(std::min<size_t>(buf.size(), 1 << 30)));
        if (r <= 0) err = SSL_get_error(ssl_, r);
      }
      MOESH_RETURN_IF_ERROR(flush(deadline));  // a read may answer the peer (TLS 1.3 key update)
      if (r > 0) return static_cast<size_t>(r);
      if (err == SSL_ERROR_ZERO_RETURN)
        return make_error(StatusCode::kUnavailable, "{}: the peer closed the TLS session", describe());
      if (err != SSL_ERROR_WANT_READ) return tls_error("read", err);
      MOESH_RETURN_IF_ERROR(pull(deadline));
    }
  }

  void close() override { inner_->close(); }
  std::string describe() const override { return "tls " + inner_->describe(); }
  // The arrival of the newest ciphertext read: the record that held the plaintext, or a later one.
  Clock::time_point last_arrival() const override { return inner_->last_arrival(); }

 private:
  // Encrypted bytes OpenSSL has produced -> the inner stream.
  Status flush(Deadline deadline) {
    std::lock_guard<std::mutex> w(write_mu_);
    std::vector<uint8_t> out;
    {
      std::lock_guard<std::mutex> lk(ssl_mu_);
      const size_t n = BIO_ctrl_pending(wbio_);
      if (n == 0) return Status::ok();
      out.resize(n);
      const int got = BIO_read(wbio_, out.data(), static_cast<int>(n));
      out.resize(got > 0 ? static_cast<size_t>(got) : 0);
    }
    return inner_->write_all(out, deadline);
  }
  // Encrypted bytes from the inner stream -> OpenSSL.
  Status pull(Deadline deadline) {
    uint8_t tmp[16 * 1024];
    auto n = inner_->read_some(std::span<uint8_t>(tmp, sizeof(tmp)), deadline);
    if (!n) return n.status();
    std::lock_guard<std::mutex> lk(ssl_mu_);
    if (BIO_write(rbio_, tmp, static_cast<int>(*n)) != static_cast<int>(*n))
      return make_error(StatusCode::kInternal, "{}: BIO_write failed", describe());
    return Status::ok();
  }
  Status tls_error(const char* what, int err) {
    return make_error(
        err == SSL_ERROR_SYSCALL || err == SSL_ERROR_SSL ? StatusCode::kUnavailable : StatusCode::kIoError,
        "{}: TLS {} failed (error {}): {}", describe(), what, err, ssl_errors());
  }

  std::unique_ptr<ByteStream> inner_;
  SSL* ssl_;
  BIO* rbio_ = nullptr;
  BIO* wbio_ = nullptr;
  std::mutex ssl_mu_, write_mu_, read_mu_;
};

}  // namespace

Result<std::shared_ptr<const TlsIdentity>> TlsIdentity::load(const std::string& cert_file,
                                                             const std::string& key_file) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return make_error(StatusCode::kInternal, "TLS: SSL_CTX_new: {}", ssl_errors());
  std::shared_ptr<TlsIdentity> id(new TlsIdentity());
  id->ctx_ = ctx;
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1)
    return make_error(StatusCode::kInvalidArgument, "--tls-cert '{}': not a PEM certificate ({})", cert_file,
                      ssl_errors());
  if (SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    const std::string why = ssl_errors();
    if (why.find("mismatch") != std::string::npos)
      return make_error(StatusCode::kInvalidArgument, "--tls-key '{}' does not belong to --tls-cert '{}'", key_file,
                        cert_file);
    return make_error(StatusCode::kInvalidArgument, "--tls-key '{}': not a PEM private key ({})", key_file, why);
  }
  if (SSL_CTX_check_private_key(ctx) != 1)
    return make_error(StatusCode::kInvalidArgument, "--tls-key '{}' does not belong to --tls-cert '{}'", key_file,
                      cert_file);
  id->fingerprint_ = cert_fingerprint(SSL_CTX_get0_certificate(ctx));
  return std::shared_ptr<const TlsIdentity>(std::move(id));
}

TlsIdentity::~TlsIdentity() {
  SSL_CTX_free(static_cast<SSL_CTX*>(ctx_));
}

Result<TlsPins> TlsPins::parse(const std::vector<std::string>& pins) {
  TlsPins out;
  for (const std::string& p : pins) {
    std::string hex;
    for (char c : p) {
      if (c == ':') continue;
      if (!std::isxdigit(static_cast<unsigned char>(c)))
        return make_error(StatusCode::kInvalidArgument, "--tls-pin '{}': not hex (SHA-256, 64 hex digits)", p);
      hex += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    if (hex.size() != 64)
      return make_error(StatusCode::kInvalidArgument, "--tls-pin '{}': {} hex digits, a SHA-256 has 64", p, hex.size());
    out.sha256.push_back(hex);
  }
  return out;
}

bool TlsPins::allows(const std::string& fingerprint) const {
  return std::find(sha256.begin(), sha256.end(), fingerprint) != sha256.end();
}

Result<std::unique_ptr<ByteStream>> tls_server(std::unique_ptr<ByteStream> inner, const TlsIdentity& id,
                                               Deadline deadline) {
  SSL* ssl = SSL_new(static_cast<SSL_CTX*>(id.ctx()));
  if (ssl == nullptr) return make_error(StatusCode::kInternal, "TLS: SSL_new: {}", ssl_errors());
  SSL_set_accept_state(ssl);
  auto s = std::make_unique<TlsStream>(std::move(inner), ssl);
  if (Status st = s->handshake(deadline); !st.is_ok())
    return st.with_context("TLS server handshake (is the backbone started with --tls-pin?)");
  return std::unique_ptr<ByteStream>(std::move(s));
}

Result<std::unique_ptr<ByteStream>> tls_client(std::unique_ptr<ByteStream> inner, const TlsPins& pins,
                                               Deadline deadline) {
  SSL* ssl = SSL_new(client_ctx());
  if (ssl == nullptr) return make_error(StatusCode::kInternal, "TLS: SSL_new: {}", ssl_errors());
  SSL_set_connect_state(ssl);
  auto s = std::make_unique<TlsStream>(std::move(inner), ssl);
  if (Status st = s->handshake(deadline); !st.is_ok())
    return st.with_context("TLS client handshake (does the worker run with --tls-cert/--tls-key?)");
  const std::string fp = s->peer_fingerprint();
  if (!pins.allows(fp))
    return make_error(StatusCode::kUnauthenticated,
                      "{}: the worker's certificate (sha256 {}) is not pinned; add --tls-pin {} if it is yours",
                      s->describe(), fp.empty() ? "none" : fp, fp);
  return std::unique_ptr<ByteStream>(std::move(s));
}

Result<wire::Frame> FrameReader::read(ByteStream& s, Deadline deadline, uint32_t max_payload) {
  for (;;) {
    const size_t need = have_ < wire::kHeaderBytes ? wire::kHeaderBytes : wire::kHeaderBytes + header_.payload_bytes;
    if (raw_.size() < need) raw_.resize(need);
    if (have_ == need) {
      if (need == wire::kHeaderBytes) {
        auto h = wire::parse_header(std::span<const uint8_t>(raw_.data(), wire::kHeaderBytes), max_payload);
        if (!h) return h.status();
        header_ = *h;
        if (header_.payload_bytes > 0) continue;
      }
      auto f = wire::parse_frame(std::span<const uint8_t>(raw_.data(), have_), max_payload);
      last_.assign(raw_.begin(), raw_.begin() + static_cast<std::ptrdiff_t>(have_));
      have_ = 0;
      header_ = {};
      return f;
    }
    auto n = s.read_some(std::span<uint8_t>(raw_.data() + have_, need - have_), deadline);
    if (!n) return n.status();
    have_ += *n;
  }
}

}  // namespace moesh::net
