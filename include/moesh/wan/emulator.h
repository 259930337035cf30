// `moesh wan-emu`: a packet-level WAN on one machine (docs/wan-emu.md).
//
// One hub namespace (the backbone's side) and one namespace per peer (a worker's side), each
// peer joined to the hub by a pair of TUN devices: `wan<i>` in the hub, `wan0` in peer i's
// namespace. This process holds all the TUN fds and forwards every IP packet between the two ends
// of each pair through a DelayLine per direction, so the kernel's own TCP (slow start, pacing,
// idle restart, loss recovery) runs over the modelled path. Peer i's link is the /30
// 10.77.<i>.0: the hub has 10.77.<i>.1, the peer 10.77.<i>.2, and each peer routes 10.77.0.0/16
// through the hub (which forwards), so peers reach each other over both their links. The
// addresses exist only inside these namespaces, so several emulators (different names) coexist.
//
// Needs root (CAP_SYS_ADMIN for namespaces, CAP_NET_ADMIN for TUN and addresses) and `ip`.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "moesh/util/status.h"
#include "moesh/wan/delay_line.h"
#include "moesh/wan/spec.h"

namespace moesh::wan {

struct EmuSpec {
  std::string name;             // valid_emu_name: namespaces are moesh-<name>-hub and moesh-<name>-<peer>
  std::vector<PeerSpec> peers;  // 1..250, distinct names
  uint64_t seed = 1;            // loss and jitter: direction d of peer i draws from seed, i, d
  int mtu = 1500;
  int txqueuelen = 10000;  // TUN queue (netstack.md finding 4: the default 500 drops bursts)
  // Written inside every namespace created: 0 (the default here) keeps a connection's window
  // across idle gaps, as an operator-tuned host would.
  int slow_start_after_idle = 0;
};

struct EmuPeer {
  std::string name;
  std::string netns;      // moesh-<emu>-<peer>
  std::string hub_if;     // wan<i> in the hub namespace
  std::string peer_if;    // wan0 in the peer namespace
  std::string hub_addr;   // 10.77.<i>.1
  std::string peer_addr;  // 10.77.<i>.2
  LinkSpec link;
};

struct EmuDirectionStats {
  DelayLineStats line;
  uint64_t write_errors = 0;
};

std::string hub_netns_name(const std::string& emu);
std::string peer_netns_name(const std::string& emu, const std::string& peer);
// Every existing namespace of this emulator name (moesh-<emu>-<x>, x without '-').
std::vector<std::string> emu_namespaces(const std::string& emu);
// Where `up` records its pid, for `down`: /run/moesh-wan/<emu>.pid.
std::string emu_pidfile(const std::string& emu);

// Deletes every namespace of `emu` (a crashed or killed `up` leaves them behind); returns their
// names. Errors name the namespace that could not be deleted.
Result<std::vector<std::string>> remove_emu_namespaces(const std::string& emu);

class Emulator {
 public:
  // Creates the namespaces and TUN pairs and configures addresses, routes and sysctls. On
  // failure everything created so far is removed again.
  static Result<std::unique_ptr<Emulator>> create(EmuSpec spec);
  ~Emulator();  // destroy()
  Emulator(const Emulator&) = delete;
  Emulator& operator=(const Emulator&) = delete;

  const std::string& hub_netns() const { return hub_netns_; }
  const std::vector<EmuPeer>& peers() const { return peers_; }
  const EmuSpec& spec() const { return spec_; }

  // Forwards packets until stop(). An error if polling or reading a TUN device failed (the
  // TUN fds keep their namespaces alive, so `ip netns del` of a name does not cause one).
  Status run();
  // Async-signal-safe: makes run() return.
  void stop();
  // Closes the TUN devices and deletes the namespaces; idempotent. The first error, if any.
  Status destroy();

  // Per peer: [0] hub -> peer ("down"), [1] peer -> hub ("up"). Read after run() returned.
  EmuDirectionStats stats(size_t peer, int direction) const;

 private:
  explicit Emulator(EmuSpec spec);
  Status setup();

  struct Direction {
    int in_fd = -1;
    int out_fd = -1;
    DelayLine line;
    uint64_t write_errors = 0;
    explicit Direction(LinkSpec l) : line(l) {}
  };

  EmuSpec spec_;
  std::string hub_netns_;
  std::vector<EmuPeer> peers_;
  std::vector<std::string> created_ns_;
  std::vector<int> hub_fds_, peer_fds_;
  std::vector<Direction> dirs_;  // 2 per peer
  int stop_fd_ = -1;             // eventfd
  bool destroyed_ = false;
};

}  // namespace moesh::wan
