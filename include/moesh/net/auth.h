// Swarm keys: a shared secret every member of one swarm holds (`--swarm-key FILE` on every
// command that connects or listens). Each connection proves it both ways right after the HELLOs —
// a mutual HMAC-SHA256 challenge-response — before any request is served, so a stranger's machine
// can neither take work from a backbone nor get a worker to compute for it.
//
// After the HELLOs (both set wire::kFeatureAuth):
//   acceptor  -> AUTH {challenge ca}
//   initiator -> AUTH {challenge ci, proof HMAC(key, ctx(initiator, ca, ci))}
//   acceptor verifies, then -> AUTH {proof HMAC(key, ctx(acceptor, ci, ca))};  initiator verifies.
// ctx(role, c_peer, c_own) = "moesh-swarm-auth-v1" | role | c_peer | c_own | model id: proofs are
// bound to both fresh challenges (no replay), to the sender's role (no reflection) and to the
// model. The acceptor — the side strangers dial — proves nothing before the initiator has. A side
// with a key refuses a peer without one and the other way round; every refusal is an ERROR frame
// (kUnauthenticated) and a Status naming the peer.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moesh/util/status.h"
#include "moesh/wire/wire.h"

namespace moesh::net {

class ByteStream;
class Connection;
class FrameReader;

struct SwarmKey {
  std::vector<uint8_t> bytes;
  // Reads a key file (the whole file, trailing whitespace dropped; at least 16 bytes, e.g.
  // `head -c 32 /dev/urandom | base64 > swarm.key`). Errors name the file. A file that others
  // may read is accepted with a warning on stderr.
  static Result<std::shared_ptr<const SwarmKey>> load(const std::string& path);
  // The first 8 bytes of SHA-256 of the key, in hex: which key a process uses, safe to log.
  std::string fingerprint() const;
};

// The AUTH exchange of a connection whose HELLOs both set kFeatureAuth (handshake() runs it).
Status authenticate(Connection& conn, const SwarmKey& key, const wire::Hello& local, const wire::Hello& peer,
                    bool initiator, std::chrono::steady_clock::time_point deadline);

// Admission at a relay (`moesh relay --swarm-key`): the same exchange on the raw stream right
// after the dialer's ROUTE JOIN/CONNECT, bound to the ROUTE's worker name instead of a model (a
// relay holds none). relay_auth_accept is the relay's side (it challenges first);
// relay_auth_dial the worker's or backbone's, given the relay's challenge frame it has read.
// Refusals are ERROR kUnauthenticated frames and a Status naming the peer.
Status relay_auth_accept(ByteStream& s, FrameReader& r, const SwarmKey& key, const std::string& route_name,
                         std::chrono::steady_clock::time_point deadline);
Status relay_auth_dial(ByteStream& s, FrameReader& r, const wire::Frame& challenge, const SwarmKey& key,
                       const std::string& route_name, std::chrono::steady_clock::time_point deadline);

}  // namespace moesh::net
