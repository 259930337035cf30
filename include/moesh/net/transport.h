// Transports for moesh frames: one interface, several implementations.
//
// Layers, bottom up:
//   ByteStream  — a reliable ordered byte pipe with deadlines: TCP (tcp_connect / TcpListener),
//                 an in-process loopback pair, or a fault-injecting wrapper around either.
//   Connection  — whole wire frames over a ByteStream: send_frame writes one encoded frame,
//                 recv_frame reads one, validating the header (magic, version, type, length
//                 against max_frame_bytes *before* allocating) and the XXH3 checksum.
//   RequestMux  — the backbone side: many requests in flight on one Connection, each reply
//                 routed by request id, each wait with its own deadline, no extra thread.
//   handshake() — the HELLO exchange every connection starts with.
//
// A worker loop is: TcpListener::accept -> make_stream_connection -> handshake(acceptor) ->
// loop { recv_frame(deadline) -> decode_dispatch -> compute -> encode_combine -> send_frame }.
//
// Every wait takes a Deadline (steady clock); nothing blocks forever. Errors: kTimeout when a
// deadline passes, kUnavailable when the peer went away (EOF, reset, closed locally), kCorrupt
// for a damaged frame (the stream cannot be resynchronised, so the Connection stops receiving;
// it can still send an ERROR before the caller closes it), kIoError for other socket failures.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "moesh/util/status.h"
#include "moesh/wire/wire.h"

namespace moesh::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_in(std::chrono::milliseconds ms) {
  return Clock::now() + ms;
}

// ---- byte streams ----------------------------------------------------------------------------

// A reliable, ordered byte pipe. One writer and one reader may use it concurrently.
class ByteStream {
 public:
  virtual ~ByteStream() = default;
  // Writes all bytes or fails. After kTimeout part of the data may have been written, so the
  // stream is no longer frame-aligned: callers close it.
  virtual Status write_all(std::span<const uint8_t> bytes, Deadline deadline) = 0;
  // Reads 1..buf.size() bytes. kTimeout if none arrived by the deadline (nothing consumed),
  // kUnavailable at end of stream or after close().
  virtual Result<size_t> read_some(std::span<uint8_t> buf, Deadline deadline) = 0;
  // Idempotent; wakes blocked readers and writers, which then return kUnavailable. The peer
  // sees end of stream.
  virtual void close() = 0;
  virtual std::string describe() const = 0;
  // When the bytes the latest read_some returned reached this host (TCP: the kernel's receive
  // timestamp, SO_TIMESTAMPNS, on this process's steady clock), or the epoch when the stream does
  // not know. A reply that waited in the socket while its reader was busy is then timed by its
  // arrival, not by when it was read. Only meaningful to the thread that called read_some.
  virtual Clock::time_point last_arrival() const { return {}; }
};

// ---- frame connections -----------------------------------------------------------------------

struct ConnectionOptions {
  uint32_t max_frame_bytes = wire::kDefaultMaxFrameBytes;  // largest payload accepted
};

// Whole frames over some transport. send_frame may be called from several threads (frames
// never interleave); recv_frame from one thread at a time, concurrently with sends.
class Connection {
 public:
  virtual ~Connection() = default;
  // `frame` is a complete encoded frame (wire::encode_* output).
  virtual Status send_frame(std::span<const uint8_t> frame, Deadline deadline) = 0;
  // The next frame, header-validated and checksum-verified. A kTimeout keeps any partly received
  // frame, and the next call resumes it.
  virtual Result<wire::Frame> recv_frame(Deadline deadline) = 0;
  virtual void close() = 0;
  virtual std::string describe() const = 0;
  // When the last byte of the frame recv_frame last returned arrived (ByteStream::last_arrival of
  // the read that completed it), or the epoch when unknown. Same thread as recv_frame.
  virtual Clock::time_point last_frame_arrival() const { return {}; }
};

std::unique_ptr<Connection> make_stream_connection(std::unique_ptr<ByteStream> stream, ConnectionOptions opts = {});

// ---- in-process loopback ---------------------------------------------------------------------

// Two connected ByteStreams; each direction buffers up to capacity_bytes (writers then block,
// which is the backpressure a socket has).
std::pair<std::unique_ptr<ByteStream>, std::unique_ptr<ByteStream>> make_loopback_streams(
    size_t capacity_bytes = size_t{8} << 20);
std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> make_loopback_pair(ConnectionOptions opts = {});

// ---- TCP ---------------------------------------------------------------------------------------

// Socket policy from docs/background/netstack.md. Congestion control and buffer sizes are applied before
// connect()/listen() (accepted sockets inherit them): set afterwards, BBR's pacing stays on.
struct TcpOptions {
  std::string congestion = "cubic";  // TCP_CONGESTION; "" keeps the system default
  bool require_congestion = false;   // fail instead of warning when the kernel refuses it
  int send_buffer_bytes = 8 << 20;   // SO_SNDBUF (0 keeps the default)
  int recv_buffer_bytes = 8 << 20;   // SO_RCVBUF (0 keeps the default)
  bool no_delay = true;              // TCP_NODELAY: frames leave at once
  // Busy-poll a receive this long (microseconds) before sleeping in poll(): a reply that comes
  // within it is picked up without the wake-up of a sleeping thread (an interrupt to another CPU,
  // 50-100 us on a virtual machine; docs/PERFORMANCE.md). It burns the waiting thread's CPU
  // meanwhile, so it pays only where that CPU has nothing else to do (pinned processes, idle
  // cores); 0 = sleep at once.
  int poll_us = 0;
};

// What a TCP stream's socket actually has (the kernel may clamp or refuse requests).
struct TcpSocketInfo {
  std::string congestion;
  int send_buffer_bytes = 0;
  int recv_buffer_bytes = 0;
  bool no_delay = false;
  std::string peer;  // "host:port"
};

// Connects to host:port (numeric IPv4/IPv6 or a name) before the deadline.
Result<std::unique_ptr<ByteStream>> tcp_connect(const std::string& host, uint16_t port, const TcpOptions& opts,
                                                Deadline deadline);
// kInvalidArgument if `stream` is not a TCP stream.
Result<TcpSocketInfo> tcp_socket_info(const ByteStream& stream);
// Takes the socket out of a TCP stream (which is destroyed; the caller owns the fd) so another
// layer can drive it, e.g. the WebSocket transport. kInvalidArgument if it is not a TCP stream.
Result<int> tcp_release_fd(std::unique_ptr<ByteStream> stream);

// Round trip to each "HOST:PORT" ("[V6]:PORT" for IPv6) measured as a TCP connect (SYN to
// SYN-ACK: one network round trip, answered by the far kernel alone), all addresses at once,
// `rounds` times, the smallest kept (seconds); -1 for one that is malformed, does not resolve,
// refuses or does not answer before the deadline. Each connection is closed at once.
std::vector<double> connect_rtts(const std::vector<std::string>& targets, int rounds, Deadline deadline);

class TcpListener {
 public:
  // port 0 picks a free port (see port()).
  static Result<std::unique_ptr<TcpListener>> listen(const std::string& host, uint16_t port, const TcpOptions& opts,
                                                     int backlog = 64);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  uint16_t port() const { return port_; }
  // kTimeout if no peer connected by the deadline; kUnavailable after close().
  Result<std::unique_ptr<ByteStream>> accept(Deadline deadline);
  void close();

 private:
  TcpListener(int fd, uint16_t port, TcpOptions opts);
  int fd_;
  uint16_t port_;
  TcpOptions opts_;
  std::atomic<bool> closed_{false};
};

// ---- fault injection ---------------------------------------------------------------------------

enum class FaultKind : uint8_t {
  kNone = 0,
  kDrop,           // the write is discarded (reports success): a lost frame
  kDelay,          // the write waits `delay` first (bounded by its deadline)
  kCorrupt,        // one bit of one byte is flipped
  kTruncate,       // only a prefix is written (reports success): the stream is now misaligned
  kCloseMidFrame,  // a prefix is written, then the stream is closed: kUnavailable
  kCOUNT
};

// Faults act per write_all call; a Connection makes exactly one call per frame, so "write n" is
// "frame n". A scheduled fault for write n wins; otherwise each kind fires with its probability
// (drawn from a generator seeded with `seed`, so runs repeat).
struct FaultPlan {
  uint64_t seed = 1;
  double p_drop = 0, p_delay = 0, p_corrupt = 0, p_truncate = 0, p_close = 0;
  std::chrono::milliseconds delay{20};
  std::vector<std::pair<uint64_t, FaultKind>> schedule;
};

struct FaultCounters {
  std::atomic<uint64_t> writes{0};
  std::atomic<uint64_t> by_kind[static_cast<int>(FaultKind::kCOUNT)] = {};
  uint64_t count(FaultKind k) const { return by_kind[static_cast<int>(k)].load(); }
};

// Wraps a stream so its writes suffer the plan's faults; reads pass through. `counters`, if
// given, records what happened (shared so tests can read it after handing the stream away).
std::unique_ptr<ByteStream> wrap_with_faults(std::unique_ptr<ByteStream> inner, FaultPlan plan,
                                             std::shared_ptr<FaultCounters> counters = nullptr);

// ---- handshake ---------------------------------------------------------------------------------

// The HELLO exchange (PROTOCOL.md §3). The initiator (the side that connected) sends its HELLO
// first; the acceptor answers with its own HELLO, or with ERROR if it cannot talk to the peer.
// Either side that rejects the other sends ERROR before returning the error; the caller closes.
// With `key` this side sets wire::kFeatureAuth and runs the swarm-key exchange of net/auth.h
// after the HELLOs; a side with a key and one without refuse each other (kUnauthenticated).
struct SwarmKey;
Result<wire::Session> handshake(Connection& conn, const wire::Hello& local, bool initiator, Deadline deadline,
                                const SwarmKey* key = nullptr);

// Best-effort ERROR frame (request_id 0 = the connection); failures to send are ignored because
// the connection is usually being torn down anyway.
void send_error(Connection& conn, uint64_t request_id, wire::WireError code, const std::string& text,
                Deadline deadline);

// ---- request multiplexing (backbone side) ------------------------------------------------------

// Where RequestMuxes report finished requests, so one thread can wait for the replies of many
// connections and take them in the order they arrived (the fan-out's gather). Thread-safe.
class CompletionQueue {
 public:
  struct Entry {
    uint64_t tag = 0;  // what the request was started with (the fan-out: worker index)
    uint64_t request_id = 0;
    Clock::time_point at;  // when the reply (or the connection's failure) was filed
  };
  // `at`: when the reply arrived, if known (a kernel receive timestamp); else, or if later than
  // now, the time of filing.
  void push(uint64_t tag, uint64_t request_id, Clock::time_point at = {});
  // The oldest entry; false if none arrived by the deadline. With a spin budget (set_poll_us) it
  // looks for one that long before sleeping (TcpOptions::poll_us says why).
  bool pop(Entry* out, Deadline deadline);
  void set_poll_us(int us) { poll_us_ = us; }

 private:
  bool take_locked(Entry* out);
  int poll_us_ = 0;
  std::atomic<size_t> filed_{0};  // entries pushed, read without the lock while spinning
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> q_;
  size_t head_ = 0;
};

// Many requests in flight on one Connection. Replies (COMBINE, PONG, ERROR with the request's id)
// are routed by request id. There is no reader thread: whichever waiter finds the connection
// idle reads frames and files them for the others ("leader/follower"), so a process needs no
// thread per connection. Thread-safe.
//
// After a receive failure other than a timeout, a connection-level ERROR or a GOODBYE, every
// pending and future wait fails with that status (failover, when it exists, is the caller's:
// today the remote executor fails the layer and names the worker).
class RequestMux {
 public:
  explicit RequestMux(Connection* conn) : conn_(conn) {}  // conn must outlive the mux
  RequestMux(const RequestMux&) = delete;
  RequestMux& operator=(const RequestMux&) = delete;

  // A fresh request id (never 0) for the next request on this connection.
  uint64_t next_request_id() { return next_id_.fetch_add(1); }
  // Later ids are all > `id` (a mux replacing another's connection: a stale completion of the old
  // one can then never be mistaken for a new request).
  void skip_request_ids_to(uint64_t id) {
    uint64_t cur = next_id_.load();
    while (cur <= id && !next_id_.compare_exchange_weak(cur, id + 1)) {
    }
  }
  // Registers request_id and sends its frame (whose header must carry that id). With `done`, the
  // request's completion (reply, ERROR, or the connection failing) is also pushed there as
  // (tag, request_id); wait() then returns at once.
  Status start(uint64_t request_id, std::span<const uint8_t> frame, Deadline send_deadline,
               CompletionQueue* done = nullptr, uint64_t tag = 0);
  // Reads and files one frame (or, while another thread is reading, waits for it), until the
  // deadline: what a dedicated reader thread calls in a loop. Returns the connection's status:
  // ok, or the error every wait now gets.
  Status pump(Deadline deadline);
  // The reply to request_id, or kTimeout at the deadline (the request is then forgotten and a
  // late reply is discarded). A reply that is an ERROR frame comes back as its Status.
  Result<wire::Frame> wait(uint64_t request_id, Deadline deadline);
  // Forgets a request; its reply, if it comes, is discarded.
  void cancel(uint64_t request_id);

  size_t n_in_flight() const;
  uint64_t n_discarded() const { return n_discarded_.load(); }  // late or unknown replies
  // PING frames from the peer (its heartbeat) are answered with PONG by whoever reads.
  uint64_t n_pings_answered() const { return pings_answered_.load(); }
  // When the last frame of any kind arrived (the epoch of Clock if none yet).
  Clock::time_point last_received() const { return Clock::time_point(Clock::duration(last_received_ns_.load())); }

 private:
  struct Slot {
    bool done = false;
    Result<wire::Frame> reply = Status(StatusCode::kInternal, "no reply yet");
    CompletionQueue* queue = nullptr;
    uint64_t tag = 0;
  };
  void route_locked(wire::Frame frame, Clock::time_point arrived);
  void fail_locked(Status st);  // the connection is gone: every pending request learns it
  // As the reader (lk held, reader_active_ false): one frame or the deadline, then wake waiters.
  void read_one(std::unique_lock<std::mutex>& lk, Deadline deadline);
  void answer_ping(const wire::Frame& frame);

  Connection* conn_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint64_t> n_discarded_{0};
  std::atomic<uint64_t> pings_answered_{0};
  std::atomic<int64_t> last_received_ns_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, Slot> slots_;
  bool reader_active_ = false;
  Status conn_error_;
};

// Round trip of one PING through a mux (PONG must echo its timestamp). With padding it doubles
// as the warm-up exchange that opens the congestion window after connect (docs/background/netstack.md).
Result<std::chrono::nanoseconds> ping(RequestMux& mux, uint32_t pad_bytes, uint32_t reply_pad_bytes, Deadline deadline);

}  // namespace moesh::net
