// Connection over a ByteStream: frame assembly with resumable receives, and the loopback pair.
#include <cstring>
#include <deque>

#include "moesh/net/transport.h"

namespace moesh::net {

namespace {

class StreamConnection final : public Connection {
 public:
  StreamConnection(std::unique_ptr<ByteStream> s, ConnectionOptions o) : stream_(std::move(s)), opts_(o) {}
  ~StreamConnection() override { stream_->close(); }

  Status send_frame(std::span<const uint8_t> frame, Deadline deadline) override {
    std::lock_guard<std::mutex> lk(send_mu_);
    if (send_broken_) return make_error(StatusCode::kUnavailable, "{}: connection closed for sending", describe());
    Status st = stream_->write_all(frame, deadline);
    // A partly written frame leaves the stream misaligned for the peer: nothing more may follow.
    if (!st.is_ok()) {
      send_broken_ = true;
      stream_->close();
    }
    return st;
  }

  Result<wire::Frame> recv_frame(Deadline deadline) override {
    std::lock_guard<std::mutex> lk(recv_mu_);
    if (!recv_error_.is_ok()) return recv_error_;
    // Header first, then exactly payload_bytes; both resumable after a timeout.
    while (have_ < wire::kHeaderBytes) {
      auto n = stream_->read_some(std::span<uint8_t>(header_ + have_, wire::kHeaderBytes - have_), deadline);
      if (!n.is_ok()) return fail(n.status(), have_ > 0);
      have_ += *n;
      arrival_ = stream_->last_arrival();
    }
    if (!header_parsed_) {
      auto h = wire::parse_header(std::span<const uint8_t>(header_, wire::kHeaderBytes), opts_.max_frame_bytes);
      if (!h.is_ok()) return fail(h.status(), true);
      frame_.header = *h;
      // Safe: parse_header bounded payload_bytes by max_frame_bytes.
      frame_.payload.resize(h->payload_bytes);
      header_parsed_ = true;
    }
    const size_t total = wire::kHeaderBytes + frame_.payload.size();
    while (have_ < total) {
      const size_t off = have_ - wire::kHeaderBytes;
      auto n = stream_->read_some(std::span<uint8_t>(frame_.payload.data() + off, total - have_), deadline);
      if (!n.is_ok()) return fail(n.status(), true);
      have_ += *n;
      arrival_ = stream_->last_arrival();
    }
    Status ck = wire::verify_checksum(std::span<const uint8_t>(header_, wire::kHeaderBytes), frame_.payload,
                                      frame_.header.checksum);
    if (!ck.is_ok()) return fail(ck, true);
    wire::Frame out = std::move(frame_);
    frame_ = wire::Frame{};
    frame_arrival_ = arrival_;  // of the read that completed the frame
    have_ = 0;
    header_parsed_ = false;
    return out;
  }

  void close() override { stream_->close(); }
  std::string describe() const override { return stream_->describe(); }
  Clock::time_point last_frame_arrival() const override { return frame_arrival_; }

 private:
  // A timeout keeps the partial frame; anything else ends receiving for good.
  Status fail(const Status& st, bool mid_frame) {
    if (st.code() == StatusCode::kTimeout) return st;
    Status out = st;
    if (st.code() == StatusCode::kUnavailable && mid_frame)
      out = make_error(StatusCode::kUnavailable, "{}: peer closed mid-frame after {} bytes ({})", describe(), have_,
                       st.message());
    else
      out = st.with_context(describe());
    recv_error_ = out;
    return out;
  }

  std::unique_ptr<ByteStream> stream_;
  ConnectionOptions opts_;
  std::mutex send_mu_;
  bool send_broken_ = false;
  std::mutex recv_mu_;
  Status recv_error_;
  uint8_t header_[wire::kHeaderBytes] = {};
  size_t have_ = 0;  // bytes of the current frame received (header included)
  bool header_parsed_ = false;
  Clock::time_point arrival_{};        // ByteStream::last_arrival after the latest read
  Clock::time_point frame_arrival_{};  // arrival_ when the last complete frame was returned
  wire::Frame frame_;
};

// One direction of a loopback pair: a bounded byte queue.
struct Pipe {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<uint8_t> buf;
  size_t capacity = 0;
  bool closed = false;
};

class LoopbackStream final : public ByteStream {
 public:
  LoopbackStream(std::shared_ptr<Pipe> in, std::shared_ptr<Pipe> out, std::string name)
      : in_(std::move(in)), out_(std::move(out)), name_(std::move(name)) {}
  ~LoopbackStream() override { close(); }

  Status write_all(std::span<const uint8_t> bytes, Deadline deadline) override {
    std::unique_lock<std::mutex> lk(out_->mu);
    size_t done = 0;
    while (done < bytes.size()) {
      if (out_->closed) return make_error(StatusCode::kUnavailable, "{}: closed", name_);
      const size_t room = out_->capacity - std::min(out_->capacity, out_->buf.size());
      if (room == 0) {
        if (out_->cv.wait_until(lk, deadline) == std::cv_status::timeout && Clock::now() >= deadline)
          return make_error(StatusCode::kTimeout, "{}: write blocked past its deadline", name_);
        continue;
      }
      const size_t n = std::min(room, bytes.size() - done);
      out_->buf.insert(out_->buf.end(), bytes.begin() + done, bytes.begin() + done + n);
      done += n;
      out_->cv.notify_all();
    }
    return Status::ok();
  }

  Result<size_t> read_some(std::span<uint8_t> buf, Deadline deadline) override {
    std::unique_lock<std::mutex> lk(in_->mu);
    while (in_->buf.empty()) {
      if (in_->closed) return make_error(StatusCode::kUnavailable, "{}: end of stream", name_);
      if (in_->cv.wait_until(lk, deadline) == std::cv_status::timeout && in_->buf.empty() && !in_->closed)
        return make_error(StatusCode::kTimeout, "{}: no data before the deadline", name_);
    }
    const size_t n = std::min(buf.size(), in_->buf.size());
    std::copy(in_->buf.begin(), in_->buf.begin() + n, buf.begin());
    in_->buf.erase(in_->buf.begin(), in_->buf.begin() + n);
    in_->cv.notify_all();
    return n;
  }

  void close() override {
    for (Pipe* p : {in_.get(), out_.get()}) {
      std::lock_guard<std::mutex> lk(p->mu);
      p->closed = true;
      p->cv.notify_all();
    }
  }
  std::string describe() const override { return name_; }

 private:
  std::shared_ptr<Pipe> in_, out_;
  std::string name_;
};

}  // namespace

std::unique_ptr<Connection> make_stream_connection(std::unique_ptr<ByteStream> stream, ConnectionOptions opts) {
  return std::make_unique<StreamConnection>(std::move(stream), opts);
}

std::pair<std::unique_ptr<ByteStream>, std::unique_ptr<ByteStream>> make_loopback_streams(size_t capacity_bytes) {
  auto a_to_b = std::make_shared<Pipe>();
  auto b_to_a = std::make_shared<Pipe>();
  a_to_b->capacity = b_to_a->capacity = std::max<size_t>(capacity_bytes, 1);
  return {std::make_unique<LoopbackStream>(b_to_a, a_to_b, "loopback:a"),
          std::make_unique<LoopbackStream>(a_to_b, b_to_a, "loopback:b")};
}

std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> make_loopback_pair(ConnectionOptions opts) {
  auto [a, b] = make_loopback_streams();
  return {make_stream_connection(std::move(a), opts), make_stream_connection(std::move(b), opts)};
}

}  // namespace moesh::net
