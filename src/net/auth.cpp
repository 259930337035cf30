// Swarm-key authentication: see include/moesh/net/auth.h.
#include "moesh/net/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <iterator>

#include "moesh/net/transport.h"

namespace moesh::net {

namespace {

constexpr size_t kMinKeyBytes = 16;
constexpr char kContext[] = "moesh-swarm-auth-v1";

using Bytes32 = std::array<uint8_t, 32>;

Bytes32 proof_of(const SwarmKey& key, wire::PeerRole sender, const Bytes32& c_peer, const Bytes32& c_own,
                 const wire::Hello& h) {
  std::vector<uint8_t> msg(kContext, kContext + sizeof(kContext) - 1);
  msg.push_back(static_cast<uint8_t>(sender));
  msg.insert(msg.end(), c_peer.begin(), c_peer.end());
  msg.insert(msg.end(), c_own.begin(), c_own.end());
  msg.insert(msg.end(), h.model_id.begin(), h.model_id.begin() + h.model_id_bytes);
  Bytes32 out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.bytes.data(), static_cast<int>(key.bytes.size()), msg.data(), msg.size(), out.data(), &len);
  return out;
}

void refuse(Connection& conn, const std::string& why, Deadline deadline) {
  wire::ErrorMsg e;
  e.code = static_cast<uint16_t>(wire::WireError::kUnauthenticated);
  e.text = why;
  auto f = wire::encode_error(e);
  if (f.is_ok()) (void)conn.send_frame(*f, deadline);
}

// The peer's next AUTH; an ERROR frame becomes its status.
Result<wire::AuthMsg> recv_auth(Connection& conn, const std::string& peer, Deadline deadline) {
  MOESH_ASSIGN_OR_RETURN(wire::Frame f, conn.recv_frame(deadline));
  if (f.type() == wire::MsgType::kError) {
    auto e = wire::decode_error(f);
    if (!e.is_ok()) return e.status();
    return e->to_status().with_context("peer '" + peer + "' refused the swarm-key authentication");
  }
  if (f.type() != wire::MsgType::kAuth) {
    return make_error(StatusCode::kUnauthenticated, "peer '{}' sent {} where its swarm-key AUTH was due", peer,
                      wire::msg_type_name(f.type()));
  }
  return wire::decode_auth(f);
}

}  // namespace

Result<std::shared_ptr<const SwarmKey>> SwarmKey::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(StatusCode::kNotFound, "swarm key file '{}' cannot be opened", path);
  auto k = std::make_shared<SwarmKey>();
  k->bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  while (!k->bytes.empty() &&
         (k->bytes.back() == '\n' || k->bytes.back() == '\r' || k->bytes.back() == ' ' || k->bytes.back() == '\t'))
    k->bytes.pop_back();
  if (k->bytes.size() < kMinKeyBytes) {
    return make_error(StatusCode::kInvalidArgument,
                      "swarm key file '{}' holds {} bytes; a key needs at least {} (e.g. head -c 32 /dev/urandom | "
                      "base64 > {})",
                      path, k->bytes.size(), kMinKeyBytes, path);
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRGRP | S_IROTH)) != 0) {
    std::fprintf(stderr, "moesh: warning: swarm key file '%s' is readable by other users (chmod 600 it)\n",
                 path.c_str());
  }
  return std::shared_ptr<const SwarmKey>(std::move(k));
}

std::string SwarmKey::fingerprint() const {
  uint8_t md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &n, EVP_sha256(), nullptr);
  std::string out;
  for (unsigned int i = 0; i < 8 && i < n; ++i) out += fmt::format("{:02x}", md[i]);
  return out;
}

Status authenticate(Connection& conn, const SwarmKey& key, const wire::Hello& local, const wire::Hello& peer,
                    bool initiator, Deadline deadline) {
  const std::string who = peer.name.empty() ? conn.describe() : peer.name;
  Bytes32 mine{};
  if (RAND_bytes(mine.data(), static_cast<int>(mine.size())) != 1) {
    return make_error(StatusCode::kInternal, "swarm-key authentication: no random bytes for a challenge");
  }
  auto mismatch = [&] {
    const std::string why = "swarm key mismatch: the proof does not match this side's key";
    refuse(conn, why, deadline);
    return make_error(StatusCode::kUnauthenticated, "peer '{}' ({}) failed swarm-key authentication: its key differs",
                      who, conn.describe());
  };
  if (!initiator) {
    wire::AuthMsg c;
    c.flags = wire::AuthMsg::kHasChallenge;
    c.challenge = mine;
    MOESH_ASSIGN_OR_RETURN(auto frame, wire::encode_auth(c));
    MOESH_RETURN_IF_ERROR(conn.send_frame(frame, deadline));
    MOESH_ASSIGN_OR_RETURN(wire::AuthMsg a, recv_auth(conn, who, deadline));
    if ((a.flags & wire::AuthMsg::kHasChallenge) == 0 || (a.flags & wire::AuthMsg::kHasProof) == 0) return mismatch();
    const Bytes32 want = proof_of(key, peer.role, mine, a.challenge, local);
    if (CRYPTO_memcmp(want.data(), a.proof.data(), want.size()) != 0) return mismatch();
    wire::AuthMsg p;
    p.flags = wire::AuthMsg::kHasProof;
    p.proof = proof_of(key, local.role, a.challenge, mine, local);
    MOESH_ASSIGN_OR_RETURN(auto pf, wire::encode_auth(p));
    return conn.send_frame(pf, deadline);
  }
  MOESH_ASSIGN_OR_RETURN(wire::AuthMsg c, recv_auth(conn, who, deadline));
  if ((c.flags & wire::AuthMsg::kHasChallenge) == 0) return mismatch();
  wire::AuthMsg a;
  a.flags = wire::AuthMsg::kHasChallenge | wire::AuthMsg::kHasProof;
  a.challenge = mine;
  a.proof = proof_of(key, local.role, c.challenge, mine, local);
  MOESH_ASSIGN_OR_RETURN(auto af, wire::encode_auth(a));
  MOESH_RETURN_IF_ERROR(conn.send_frame(af, deadline));
  MOESH_ASSIGN_OR_RETURN(wire::AuthMsg p, recv_auth(conn, who, deadline));
  if ((p.flags & wire::AuthMsg::kHasProof) == 0) return mismatch();
  const Bytes32 want = proof_of(key, peer.role, mine, c.challenge, local);
  if (CRYPTO_memcmp(want.data(), p.proof.data(), want.size()) != 0) return mismatch();
  return Status::ok();
}

}  // namespace moesh::net
