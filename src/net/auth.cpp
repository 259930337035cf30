// Swarm-key authentication: see include/moesh/net/auth.h.
#include "moesh/net/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <string_view>

#include "moesh/net/tls.h"
#include "moesh/net/transport.h"

namespace moesh::net {

namespace {

constexpr size_t kMinKeyBytes = 16;
constexpr std::string_view kContext = "moesh-swarm-auth-v1";
// At a relay (no model there): its own context, roles of their own, bound to the ROUTE name.
constexpr std::string_view kRelayContext = "moesh-relay-auth-v1";
constexpr uint8_t kRelayRole = 0x52, kDialerRole = 0x44;

using Bytes32 = std::array<uint8_t, 32>;

// HMAC(key, context | sender role | the peer's challenge | the sender's own | binding).
Bytes32 proof_of(const SwarmKey& key, std::string_view context, uint8_t sender, const Bytes32& c_peer,
                 const Bytes32& c_own, std::span<const uint8_t> binding) {
  std::vector<uint8_t> msg(context.begin(), context.end());
  msg.push_back(sender);
  msg.insert(msg.end(), c_peer.begin(), c_peer.end());
  msg.insert(msg.end(), c_own.begin(), c_own.end());
  msg.insert(msg.end(), binding.begin(), binding.end());
  Bytes32 out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.bytes.data(), static_cast<int>(key.bytes.size()), msg.data(), msg.size(), out.data(), &len);
  return out;
}

// How one exchange talks: frames out, frames in (ERROR frames already turned into a Status).
struct Channel {
  std::function<Status(std::span<const uint8_t>)> send;
  std::function<Result<wire::Frame>()> recv;
  std::string who;    // the peer, for messages
  std::string where;  // the connection
};

void refuse(Channel& ch, const std::string& why) {
  wire::ErrorMsg e;
  e.code = static_cast<uint16_t>(wire::WireError::kUnauthenticated);
  e.text = why;
  auto f = wire::encode_error(e);
  if (f.is_ok()) (void)ch.send(*f);
}

// The peer's next AUTH; an ERROR frame becomes its status.
Result<wire::AuthMsg> recv_auth(Channel& ch) {
  MOESH_ASSIGN_OR_RETURN(wire::Frame f, ch.recv());
  if (f.type() == wire::MsgType::kError) {
    auto e = wire::decode_error(f);
    if (!e.is_ok()) return e.status();
    return e->to_status().with_context("peer '" + ch.who + "' refused the swarm-key authentication");
  }
  if (f.type() != wire::MsgType::kAuth) {
    return make_error(StatusCode::kUnauthenticated, "peer '{}' sent {} where its swarm-key AUTH was due", ch.who,
                      wire::msg_type_name(f.type()));
  }
  return wire::decode_auth(f);
}

// The mutual challenge-response of auth.h. The acceptor challenges first; the initiator answers
// with its own challenge and proof (`first` is the acceptor's challenge when the caller has
// already read it); the acceptor checks and proves; the initiator checks.
Status exchange(Channel& ch, const SwarmKey& key, std::string_view context, uint8_t local_role, uint8_t peer_role,
                std::span<const uint8_t> binding, bool initiator, const wire::AuthMsg* first = nullptr) {
  Bytes32 mine{};
  if (RAND_bytes(mine.data(), static_cast<int>(mine.size())) != 1) {
    return make_error(StatusCode::kInternal, "swarm-key authentication: no random bytes for a challenge");
  }
  auto mismatch = [&] {
    refuse(ch, "swarm key mismatch: the proof does not match this side's key");
    return make_error(StatusCode::kUnauthenticated, "peer '{}' ({}) failed swarm-key authentication: its key differs",
                      ch.who, ch.where);
  };
  if (!initiator) {
    wire::AuthMsg c;
    c.flags = wire::AuthMsg::kHasChallenge;
    c.challenge = mine;
    MOESH_ASSIGN_OR_RETURN(auto frame, wire::encode_auth(c));
    MOESH_RETURN_IF_ERROR(ch.send(frame));
    MOESH_ASSIGN_OR_RETURN(wire::AuthMsg a, recv_auth(ch));
    if ((a.flags & wire::AuthMsg::kHasChallenge) == 0 || (a.flags & wire::AuthMsg::kHasProof) == 0) return mismatch();
    const Bytes32 want = proof_of(key, context, peer_role, mine, a.challenge, binding);
    if (CRYPTO_memcmp(want.data(), a.proof.data(), want.size()) != 0) return mismatch();
    wire::AuthMsg p;
    p.flags = wire::AuthMsg::kHasProof;
    p.proof = proof_of(key, context, local_role, a.challenge, mine, binding);
    MOESH_ASSIGN_OR_RETURN(auto pf, wire::encode_auth(p));
    return ch.send(pf);
  }
  wire::AuthMsg c;
  if (first != nullptr) {
    c = *first;
  } else {
    MOESH_ASSIGN_OR_RETURN(c, recv_auth(ch));
  }
  if ((c.flags & wire::AuthMsg::kHasChallenge) == 0) return mismatch();
  wire::AuthMsg a;
  a.flags = wire::AuthMsg::kHasChallenge | wire::AuthMsg::kHasProof;
  a.challenge = mine;
  a.proof = proof_of(key, context, local_role, c.challenge, mine, binding);
  MOESH_ASSIGN_OR_RETURN(auto af, wire::encode_auth(a));
  MOESH_RETURN_IF_ERROR(ch.send(af));
  MOESH_ASSIGN_OR_RETURN(wire::AuthMsg p, recv_auth(ch));
  if ((p.flags & wire::AuthMsg::kHasProof) == 0) return mismatch();
  const Bytes32 want = proof_of(key, context, peer_role, mine, c.challenge, binding);
  if (CRYPTO_memcmp(want.data(), p.proof.data(), want.size()) != 0) return mismatch();
  return Status::ok();
}

Channel stream_channel(ByteStream& s, FrameReader& r, std::string who, Deadline deadline) {
  Channel ch;
  ch.send = [&s, deadline](std::span<const uint8_t> f) { return s.write_all(f, deadline); };
  ch.recv = [&s, &r, deadline]() { return r.read(s, deadline); };
  ch.where = s.describe();
  ch.who = std::move(who);
  return ch;
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
  Channel ch;
  ch.send = [&conn, deadline](std::span<const uint8_t> f) { return conn.send_frame(f, deadline); };
  ch.recv = [&conn, deadline]() { return conn.recv_frame(deadline); };
  ch.where = conn.describe();
  ch.who = peer.name.empty() ? ch.where : peer.name;
  // Bound to the model: a proof made for one swarm's model is no use in another's.
  return exchange(ch, key, kContext, static_cast<uint8_t>(local.role), static_cast<uint8_t>(peer.role),
                  std::span<const uint8_t>(local.model_id.data(), local.model_id_bytes), initiator);
}

Status relay_auth_accept(ByteStream& s, FrameReader& r, const SwarmKey& key, const std::string& route_name,
                         Deadline deadline) {
  Channel ch = stream_channel(s, r, s.describe(), deadline);
  return exchange(ch, key, kRelayContext, kRelayRole, kDialerRole,
                  std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(route_name.data()), route_name.size()),
                  /*initiator=*/false);
}

Status relay_auth_dial(ByteStream& s, FrameReader& r, const wire::Frame& challenge, const SwarmKey& key,
                       const std::string& route_name, Deadline deadline) {
  Channel ch = stream_channel(s, r, "relay " + s.describe(), deadline);
  MOESH_ASSIGN_OR_RETURN(wire::AuthMsg first, wire::decode_auth(challenge));
  return exchange(ch, key, kRelayContext, kDialerRole, kRelayRole,
                  std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(route_name.data()), route_name.size()),
                  /*initiator=*/true, &first);
}

}  // namespace moesh::net
