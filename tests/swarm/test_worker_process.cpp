// A real `moesh worker` process on 127.0.0.1, driven through the transport: handshake values,
// EXACT bits against expert_ffn, PARTIAL against the rank-order sum, several requests in flight
// whose data encodes their request id, an unheld expert, a garbage frame on one connection while
// another keeps working, SIGTERM -> GOODBYE, and SIGKILL -> a clear client error (not a timeout);
// FETCH: an expert's slabs byte-equal to the model's and matching a backbone slice's hashes.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <thread>

#include "moesh/net/transport.h"
#include "moesh/swarm/swarm.h"
#include "moesh/tensor/quant.h"
#include "swarm/swarm_test_util.h"

namespace moesh::swarm {
namespace {

using namespace std::chrono_literals;
using testing::random_rows;
using testing::small_model;

// A child `moesh worker`; its stdout is read until the "listening on HOST:PORT" line.
class WorkerProcess {
 public:
  WorkerProcess(const std::string& model, const std::string& spec, std::vector<std::string> extra = {}) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::close(fds[0]);
      const std::string bin = std::string(MOESH_BIN_DIR) + "/moesh";
      std::vector<std::string> args = {bin,        "worker",      "-m",        model, "--experts", spec,
                                       "--listen", "127.0.0.1:0", "--threads", "2",   "--name",    "test-worker"};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(bin.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_fd_ = fds[0];
    const auto until = net::deadline_in(60s);
    while (port_ == 0 && net::Clock::now() < until) {
      pollfd p{out_fd_, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      char buf[512];
      const ssize_t n = ::read(out_fd_, buf, sizeof buf);
      if (n <= 0) break;
      output_.append(buf, static_cast<size_t>(n));
      const size_t at = output_.find("listening on 127.0.0.1:");
      if (at != std::string::npos && output_.find('\n', at) != std::string::npos) {
        port_ = static_cast<uint16_t>(std::stoi(output_.substr(at + 23)));
      }
    }
  }
  ~WorkerProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
  }
  uint16_t port() const { return port_; }
  const std::string& output() const { return output_; }
  void signal(int sig) { ::kill(pid_, sig); }
  // Exit status, or -1 if it did not exit in time.
  int wait_exit(std::chrono::seconds limit) {
    const auto until = net::deadline_in(limit);
    while (net::Clock::now() < until) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(20ms);
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  uint16_t port_ = 0;
  bool reaped_ = false;
  std::string output_;
};

struct Client {
  std::unique_ptr<net::Connection> conn;
  std::unique_ptr<net::RequestMux> mux;
  wire::Session session;
};

Result<Client> connect_backbone(uint16_t port, const gguf::File& model, uint32_t features = wire::kFeatureFetch) {
  MOESH_ASSIGN_OR_RETURN(auto stream, net::tcp_connect("127.0.0.1", port, net::TcpOptions{}, net::deadline_in(5s)));
  Client c;
  c.conn = net::make_stream_connection(std::move(stream));
  MOESH_ASSIGN_OR_RETURN(ModelShape shape, model_shape(model));
  MOESH_ASSIGN_OR_RETURN(ModelIdentity id, model_identity(model));
  wire::Hello hello = make_hello(wire::PeerRole::kBackbone, id, shape, {}, "test-backbone");
  hello.features = features;
  MOESH_ASSIGN_OR_RETURN(c.session, net::handshake(*c.conn, hello, true, net::deadline_in(5s)));
  c.mux = std::make_unique<net::RequestMux>(c.conn.get());
  return c;
}

// Token t of request `id` gets hidden rows seeded by (id, t): a worker answering with another
// request's data fails the comparison.
struct Request {
  wire::DispatchMsg msg;
  std::vector<float> x;
};

Request make_request(uint64_t id, uint32_t layer, const std::vector<std::vector<std::pair<uint16_t, float>>>& toks,
                     wire::CombineMode mode, uint32_t n_embd) {
  Request r;
  r.msg.request_id = id;
  r.msg.layer = layer;
  r.msg.mode = mode;
  r.msg.deadline_ms = 5000;
  r.msg.return_dtype = wire::WireDType::kF32;
  for (const auto& pairs : toks) {
    r.msg.pair_counts.push_back(static_cast<uint8_t>(pairs.size()));
    uint8_t rank = 0;
    for (auto [e, w] : pairs) r.msg.pairs.push_back({e, rank++, w});
  }
  r.x = random_rows(id * 1000 + layer, toks.size(), n_embd);
  r.msg.hidden = *wire::encode_rows(wire::WireDType::kF32, r.x.data(), uint32_t(toks.size()), n_embd);
  return r;
}

// The expected EXACT rows, computed in this process with expert_ffn on the same file.
std::vector<float> local_exact(const ExpertStore& store, const Request& r, uint32_t n_embd) {
  std::vector<float> out;
  QuantizedRows xq;
  ExpertScratch es;
  std::vector<float> y(n_embd);
  size_t p = 0;
  for (uint32_t t = 0; t < r.msg.n_tokens(); ++t) {
    const float* xt = r.x.data() + size_t{t} * n_embd;
    for (uint8_t j = 0; j < r.msg.pair_counts[t]; ++j, ++p) {
      const ExpertStore::Slot s = store.find(r.msg.layer, r.msg.pairs[p].expert);
      quantize_rows(quant::vec_dot_type(s.weights->gate.type), xt, 1, n_embd, &xq, nullptr);
      const int32_t row0 = 0;
      expert_ffn(*s.weights, s.index, xq, xt, &row0, 1, y.data(), n_embd, &es, nullptr);
      out.insert(out.end(), y.begin(), y.end());
    }
  }
  return out;
}

std::vector<float> decode_combine_rows(const Request& r, const wire::Frame& f, const wire::Session& s) {
  auto c = wire::decode_combine(f, wire::DecodeLimits{.n_expert = s.peer.n_expert, .n_layer = s.peer.n_layer});
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  if (!c.is_ok()) return {};
  Status m = wire::check_combine_matches(r.msg, *c);
  EXPECT_TRUE(m.is_ok()) << m.to_string();
  std::vector<float> out(size_t{c->rows.n_rows} * c->rows.n_cols);
  wire::decode_rows(c->rows, out.data());
  return out;
}

// Sends one request frame through the mux and waits for its answer (an ERROR reply comes back as
// its Status); `lim` is what the reply is decoded with.
Result<wire::Frame> ask(Client& c, uint64_t id, const std::vector<uint8_t>& frame, wire::DecodeLimits* lim) {
  MOESH_RETURN_IF_ERROR(c.mux->start(id, frame, net::deadline_in(5s)));
  *lim = wire::DecodeLimits{.n_expert = c.session.peer.n_expert, .n_layer = c.session.peer.n_layer};
  return c.mux->wait(id, net::deadline_in(10s));
}

// FETCH (layer, expert): the decoded SLAB, checked to answer this request.
Result<wire::SlabMsg> fetch(Client& c, uint32_t layer, uint32_t expert) {
  const wire::FetchMsg q{.request_id = c.mux->next_request_id(), .layer = layer, .expert = expert};
  MOESH_ASSIGN_OR_RETURN(auto frame, wire::encode_fetch(q));
  wire::DecodeLimits lim;
  MOESH_ASSIGN_OR_RETURN(wire::Frame f, ask(c, q.request_id, frame, &lim));
  MOESH_ASSIGN_OR_RETURN(wire::SlabMsg m, wire::decode_slab(f, lim));
  MOESH_RETURN_IF_ERROR(wire::check_slab_matches(q, m));
  return m;
}

// STORE one expert's slab: the STORED answer, checked to answer this request.
Result<wire::StoredMsg> store(Client& c, wire::SlabMsg slab) {
  slab.request_id = c.mux->next_request_id();
  MOESH_ASSIGN_OR_RETURN(auto frame, wire::encode_store(slab));
  wire::DecodeLimits lim;
  MOESH_ASSIGN_OR_RETURN(wire::Frame f, ask(c, slab.request_id, frame, &lim));
  MOESH_ASSIGN_OR_RETURN(wire::StoredMsg m, wire::decode_stored(f, lim));
  MOESH_RETURN_IF_ERROR(wire::check_stored_matches(slab, m));
  return m;
}

// UNSTORE (layer, expert): the UNSTORED answer, checked to answer this request.
Result<wire::StoredMsg> unstore(Client& c, uint32_t layer, uint32_t expert) {
  const wire::UnstoreMsg q{.request_id = c.mux->next_request_id(), .layer = layer, .expert = expert};
  MOESH_ASSIGN_OR_RETURN(auto frame, wire::encode_unstore(q));
  wire::DecodeLimits lim;
  MOESH_ASSIGN_OR_RETURN(wire::Frame f, ask(c, q.request_id, frame, &lim));
  MOESH_ASSIGN_OR_RETURN(wire::StoredMsg m, wire::decode_unstored(f, lim));
  MOESH_RETURN_IF_ERROR(wire::check_unstored_matches(q, m));
  return m;
}

class WorkerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = small_model(MakeArch::kQwen3Moe, MakeFileType::kQ8_0, 41);
    auto f = gguf::File::open(path_);
    ASSERT_TRUE(f.is_ok());
    file_ = std::move(*f);
    auto st = ExpertStore::open(testing::open_gguf(path_), ExpertSet{});
    ASSERT_TRUE(st.is_ok()) << st.status().to_string();
    local_ = std::move(*st);
  }
  // Expert (layer, e) of the model as a STORE payload.
  wire::SlabMsg slab(uint32_t layer, uint32_t e) const {
    const ExpertStore::Slot s = local_->find(layer, e);
    return slab_of(*s.weights, s.index, layer, e);
  }
  // A worker on experts *:4-7 of the model keeping replicas in a fresh folder, with room for two
  // replicas, not three: the slice, the folder, one replica's bytes and the --replica-mb value.
  struct ReplicaWorker {
    std::string slice, dir, mb;
    uint64_t one = 0;
  };
  ReplicaWorker replica_worker(const std::string& tag) const {
    ReplicaWorker r;
    auto shape = model_shape(*file_);
    EXPECT_TRUE(shape.is_ok());
    r.slice = testing::temp_dir() + "/" + tag + "-experts.gguf";
    r.dir = testing::temp_dir() + "/" + tag + "-replicas";
    std::filesystem::remove_all(r.dir);
    EXPECT_TRUE(write_expert_slice(*file_, *parse_expert_spec("*:4-7", *shape), r.slice).is_ok());
    for (const auto& t : slab(1, 2).tensors) r.one += t.bytes.size();
    r.mb = fmt::format("{:.6f}", (2.5 * double(r.one)) / 1048576.0);
    return r;
  }
  std::string path_;
  std::unique_ptr<gguf::File> file_;
  std::unique_ptr<ExpertStore> local_;
};

TEST_F(WorkerProcessTest, ServesExactPartialErrorsAndSurvivesGarbage) {
  WorkerProcess w(path_, "0:0-5,1:2-7");
  ASSERT_NE(w.port(), 0) << "worker did not start; output:\n" << w.output();
  EXPECT_NE(w.output().find("held experts: 12"), std::string::npos) << w.output();
  EXPECT_NE(w.output().find("slab bytes: "), std::string::npos) << w.output();
  EXPECT_NE(w.output().find("rss: "), std::string::npos) << w.output();

  auto c = connect_backbone(w.port(), *file_);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->session.peer.role, wire::PeerRole::kWorker);
  EXPECT_EQ(c->session.peer.name, "test-worker");
  EXPECT_EQ(c->session.peer.experts, (std::vector<wire::ExpertRange>{{0, 0, 6}, {1, 2, 6}}));
  EXPECT_EQ(c->session.dtypes, kAllDTypes);
  EXPECT_EQ(c->session.modes, kAllModes);
  const uint32_t n_embd = 64;

  // Several requests in flight at once; each reply must carry its own request's results.
  std::vector<Request> reqs;
  reqs.push_back(make_request(c->mux->next_request_id(), 0, {{{3, 0.5f}, {0, 0.3f}}, {{5, 0.9f}}},
                              wire::CombineMode::kExact, n_embd));
  reqs.push_back(make_request(c->mux->next_request_id(), 1, {{{7, 0.6f}, {2, 0.2f}, {4, 0.1f}}},
                              wire::CombineMode::kExact, n_embd));
  reqs.push_back(make_request(c->mux->next_request_id(), 1,
                              {{{2, 0.7f}, {6, 0.3f}}, {{3, 0.5f}, {4, 0.25f}}, {{7, 1.0f}}},
                              wire::CombineMode::kPartial, n_embd));
  for (const Request& r : reqs) {
    ASSERT_TRUE(c->mux->start(r.msg.request_id, *wire::encode_dispatch(r.msg), net::deadline_in(5s)).is_ok());
  }
  for (int i = 2; i >= 0; --i) {  // wait in reverse order: replies are routed by id
    const Request& r = reqs[i];
    auto f = c->mux->wait(r.msg.request_id, net::deadline_in(10s));
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    const std::vector<float> got = decode_combine_rows(r, *f, c->session);
    const std::vector<float> exact = local_exact(*local_, r, n_embd);
    if (r.msg.mode == wire::CombineMode::kExact) {
      ASSERT_EQ(got.size(), exact.size());
      EXPECT_EQ(std::memcmp(got.data(), exact.data(), got.size() * 4), 0) << "request " << i;
    } else {
      ASSERT_EQ(got.size(), size_t{r.msg.n_tokens()} * n_embd);
      size_t p = 0;
      for (uint32_t t = 0; t < r.msg.n_tokens(); ++t) {
        std::vector<float> o(n_embd);
        for (uint8_t j = 0; j < r.msg.pair_counts[t]; ++j, ++p) {
          for (uint32_t d = 0; d < n_embd; ++d) {
            const float yw = exact[p * n_embd + d] * r.msg.pairs[p].weight;
            o[d] = j == 0 ? yw : o[d] + yw;
          }
        }
        EXPECT_EQ(std::memcmp(o.data(), got.data() + size_t{t} * n_embd, n_embd * 4), 0) << "token " << t;
      }
    }
    double norm = 0;
    for (float v : got) norm += double(v) * v;
    EXPECT_GT(norm, 1e-6) << "degenerate result";
  }

  // An unheld expert (layer 1 expert 1) is refused, naming it; the connection stays usable.
  Request bad = make_request(c->mux->next_request_id(), 1, {{{2, 0.5f}, {1, 0.5f}}}, wire::CombineMode::kExact, n_embd);
  ASSERT_TRUE(c->mux->start(bad.msg.request_id, *wire::encode_dispatch(bad.msg), net::deadline_in(5s)).is_ok());
  auto bad_reply = c->mux->wait(bad.msg.request_id, net::deadline_in(10s));
  ASSERT_FALSE(bad_reply.is_ok());
  EXPECT_EQ(bad_reply.status().code(), StatusCode::kNotFound) << bad_reply.status().to_string();
  EXPECT_NE(bad_reply.status().message().find("layer 1 expert 1"), std::string::npos) << bad_reply.status().message();

  // A second connection sends garbage: the worker answers ERROR MALFORMED (or closes) ...
  {
    auto s = net::tcp_connect("127.0.0.1", w.port(), net::TcpOptions{}, net::deadline_in(5s));
    ASSERT_TRUE(s.is_ok());
    auto conn = net::make_stream_connection(std::move(*s));
    auto hb = make_hello(wire::PeerRole::kBackbone, *model_identity(*file_), *model_shape(*file_), {}, "evil");
    ASSERT_TRUE(net::handshake(*conn, hb, true, net::deadline_in(5s)).is_ok());
    std::vector<uint8_t> junk(64, 0xAB);
    ASSERT_TRUE(conn->send_frame(junk, net::deadline_in(5s)).is_ok());
    auto f = conn->recv_frame(net::deadline_in(5s));
    if (f.is_ok()) {
      EXPECT_EQ(f->type(), wire::MsgType::kError);
      auto e = wire::decode_error(*f);
      ASSERT_TRUE(e.is_ok());
      EXPECT_EQ(e->code, uint16_t(wire::WireError::kMalformed));
      EXPECT_EQ(e->request_id, 0u);
      f = conn->recv_frame(net::deadline_in(5s));
    }
    EXPECT_FALSE(f.is_ok());
    EXPECT_EQ(f.status().code(), StatusCode::kUnavailable) << f.status().to_string();
  }
  // ... and a connection that skips the handshake is refused too.
  {
    auto s = net::tcp_connect("127.0.0.1", w.port(), net::TcpOptions{}, net::deadline_in(5s));
    ASSERT_TRUE(s.is_ok());
    auto conn = net::make_stream_connection(std::move(*s));
    ASSERT_TRUE(conn->send_frame(*wire::encode_dispatch(reqs[0].msg), net::deadline_in(5s)).is_ok());
    auto f = conn->recv_frame(net::deadline_in(5s));
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    EXPECT_EQ(f->type(), wire::MsgType::kError);
  }
  // The first connection still works.
  auto rtt = net::ping(*c->mux, 100000, 100000, net::deadline_in(5s));
  ASSERT_TRUE(rtt.is_ok()) << rtt.status().to_string();
  Request again = make_request(c->mux->next_request_id(), 0, {{{1, 1.0f}}}, wire::CombineMode::kExact, n_embd);
  ASSERT_TRUE(c->mux->start(again.msg.request_id, *wire::encode_dispatch(again.msg), net::deadline_in(5s)).is_ok());
  auto f = c->mux->wait(again.msg.request_id, net::deadline_in(10s));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  const std::vector<float> got = decode_combine_rows(again, *f, c->session);
  const std::vector<float> want = local_exact(*local_, again, n_embd);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);

  // A backbone of another model is refused at the handshake.
  {
    auto other = gguf::File::open(small_model(MakeArch::kQwen3Moe, MakeFileType::kQ8_0, 42));
    ASSERT_TRUE(other.is_ok());
    auto c2 = connect_backbone(w.port(), **other);
    ASSERT_FALSE(c2.is_ok());
    EXPECT_EQ(c2.status().code(), StatusCode::kInvalidArgument) << c2.status().to_string();
  }

  // SIGTERM: the worker says GOODBYE (pending waits fail with kUnavailable) and exits 0.
  w.signal(SIGTERM);
  EXPECT_EQ(w.wait_exit(10s), 0);
  // The GOODBYE (or the close after it) is what the next request on this connection finds.
  auto after = net::ping(*c->mux, 0, 0, net::deadline_in(5s));
  ASSERT_FALSE(after.is_ok());
  EXPECT_EQ(after.status().code(), StatusCode::kUnavailable) << after.status().to_string();
  EXPECT_NE(w.output().find("listening"), std::string::npos);
}

TEST_F(WorkerProcessTest, StartsFromASliceAndKilledWorkerFailsFastWithinDeadline) {
  const std::string slice = testing::temp_dir() + "/proc-slice.gguf";
  auto shape = model_shape(*file_);
  ASSERT_TRUE(shape.is_ok());
  ASSERT_TRUE(write_expert_slice(*file_, *parse_expert_spec("*:4-7", *shape), slice).is_ok());
  WorkerProcess w(slice, "1:4-7");
  ASSERT_NE(w.port(), 0) << "worker did not start; output:\n" << w.output();
  EXPECT_NE(w.output().find("held experts: 4"), std::string::npos) << w.output();
  auto c = connect_backbone(w.port(), *file_);  // backbone on the full model: same identity
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->session.peer.experts, (std::vector<wire::ExpertRange>{{1, 4, 4}}));
  const uint32_t n_embd = 64;
  Request r = make_request(c->mux->next_request_id(), 1, {{{6, 0.5f}, {4, 0.5f}}}, wire::CombineMode::kExact, n_embd);
  ASSERT_TRUE(c->mux->start(r.msg.request_id, *wire::encode_dispatch(r.msg), net::deadline_in(5s)).is_ok());
  auto f = c->mux->wait(r.msg.request_id, net::deadline_in(10s));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  const std::vector<float> got = decode_combine_rows(r, *f, c->session);
  const std::vector<float> want = local_exact(*local_, r, n_embd);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);

  // SIGKILL: no GOODBYE. The process is reaped, so the kernel has closed its socket (FIN, or RST
  // once we write): a request sent after the kill fails fast with kUnavailable (EOF/reset at the
  // send or the wait). Failing fast is asserted by the code: had the client only given up at its
  // deadline, the result would be kTimeout.
  w.signal(SIGKILL);
  EXPECT_EQ(w.wait_exit(10s), 128 + SIGKILL);
  Request late = make_request(c->mux->next_request_id(), 1, {{{5, 1.0f}}}, wire::CombineMode::kExact, n_embd);
  Status sent = c->mux->start(late.msg.request_id, *wire::encode_dispatch(late.msg), net::deadline_in(5s));
  Status result = sent;
  if (sent.is_ok()) {
    auto lf = c->mux->wait(late.msg.request_id, net::deadline_in(30s));
    result = lf.is_ok() ? Status::ok() : lf.status();
  }
  ASSERT_FALSE(result.is_ok());
  EXPECT_EQ(result.code(), StatusCode::kUnavailable) << result.to_string();
  // A fresh connection to the dead port is refused at once.
  auto s = net::tcp_connect("127.0.0.1", w.port(), net::TcpOptions{}, net::deadline_in(2s));
  EXPECT_FALSE(s.is_ok());
}

TEST_F(WorkerProcessTest, FetchGivesTheModelsSlabsVerifiedByTheBackboneSlicesHashes) {
  // Worker on an expert slice, backbone on a backbone slice: neither process reads the model, yet
  // the fetched bytes must be the model's slabs and hash to what the backbone slice recorded.
  auto shape = model_shape(*file_);
  ASSERT_TRUE(shape.is_ok());
  const std::string es = testing::temp_dir() + "/fetch-experts.gguf", bs = testing::temp_dir() + "/fetch-bb.gguf";
  ASSERT_TRUE(write_expert_slice(*file_, *parse_expert_spec("*:4-7", *shape), es).is_ok());
  ASSERT_TRUE(write_backbone_slice(*file_, bs).is_ok());
  auto bb = gguf::File::open(bs);
  ASSERT_TRUE(bb.is_ok()) << bb.status().to_string();
  WorkerProcess w(es, "*:4-7");
  ASSERT_NE(w.port(), 0) << "worker did not start; output:\n" << w.output();
  auto c = connect_backbone(w.port(), **bb);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->session.features, wire::kFeatureFetch);
  EXPECT_NE(c->session.peer.features & wire::kFeatureFetch, 0u);

  const char* kinds[3] = {"gate", "up", "down"};
  auto check = [&](uint32_t layer, uint32_t expert) {
    auto m = fetch(*c, layer, expert);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    for (int t = 0; t < 3; ++t) {
      const std::string name = fmt::format("blk.{}.ffn_{}_exps.weight", layer, kinds[t]);
      auto v = file_->tensor(name);
      ASSERT_TRUE(v.is_ok()) << v.status().to_string();
      const wire::SlabTensor& st = m->tensors[t];
      EXPECT_EQ(st.type, v->type) << name;
      EXPECT_EQ(st.ne0, uint64_t(v->ne[0])) << name;
      EXPECT_EQ(st.ne1, uint64_t(v->ne[1])) << name;
      ASSERT_EQ(st.bytes.size(), expert_slab_bytes(*v)) << name;
      EXPECT_EQ(std::memcmp(st.bytes.data(), v->data + expert_slab_offset(*v, expert), st.bytes.size()), 0)
          << name << " expert " << expert;
      // What a backbone on the backbone slice trusts: the slice's hash, not the worker's word.
      auto trusted = expert_slab_hashes(**bb, name);
      ASSERT_TRUE(trusted.is_ok()) << trusted.status().to_string();
      EXPECT_EQ(st.hash, (*trusted)[expert]) << name << " expert " << expert;
      EXPECT_EQ(st.hash, slab_hash(st.bytes.data(), st.bytes.size()));
    }
  };
  check(1, 5);
  check(0, 4);
  check(1, 7);
  check(1, 5);  // again, from the worker's hash cache

  // Experts it does not hold, ids out of range, and a hostile FETCH: ERROR with the request id,
  // naming what was wrong; the connection stays usable.
  auto unheld = fetch(*c, 1, 1);
  ASSERT_FALSE(unheld.is_ok());
  EXPECT_EQ(unheld.status().code(), StatusCode::kNotFound) << unheld.status().to_string();
  EXPECT_NE(unheld.status().message().find("layer 1 expert 1 is not held"), std::string::npos)
      << unheld.status().message();
  auto bad_layer = fetch(*c, 5, 4);
  ASSERT_FALSE(bad_layer.is_ok());
  EXPECT_EQ(bad_layer.status().code(), StatusCode::kCorrupt) << bad_layer.status().to_string();
  EXPECT_NE(bad_layer.status().message().find("layer 5 out of range"), std::string::npos)
      << bad_layer.status().message();
  auto bad_expert = fetch(*c, 1, 8);
  ASSERT_FALSE(bad_expert.is_ok());
  EXPECT_NE(bad_expert.status().message().find("expert 8 out of range"), std::string::npos)
      << bad_expert.status().message();
  {
    const uint64_t id = c->mux->next_request_id();
    const uint8_t junk[3] = {1, 2, 3};
    ASSERT_TRUE(c->mux->start(id, wire::build_frame(wire::MsgType::kFetch, id, junk), net::deadline_in(5s)).is_ok());
    auto r = c->mux->wait(id, net::deadline_in(10s));
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << r.status().to_string();
    EXPECT_NE(r.status().message().find("FETCH payload is 3 bytes"), std::string::npos) << r.status().message();
  }
  check(0, 7);

  // A backbone that did not offer the feature is refused FETCH (like an un-negotiated dtype).
  auto plain = connect_backbone(w.port(), **bb, /*features=*/0);
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  EXPECT_EQ(plain->session.features, 0u);
  auto refused = fetch(*plain, 1, 5);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnsupported) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("not negotiated"), std::string::npos) << refused.status().message();
}

// Replicas: a worker on an expert slice with --replica-dir/--replica-mb takes an expert it does not
// hold (STORE), checks it against the model's hashes its slice carries, maps it and computes with
// it bit-exactly; a slab that is not the model's (however well its own hash matches), one over the
// budget and one from a backbone that did not negotiate STORE are refused naming why; after a
// restart the replica is mapped again from the folder and announced in the HELLO.
TEST_F(WorkerProcessTest, StoredReplicasAreCheckedMappedServedAndKeptAcrossRestarts) {
  auto shape = model_shape(*file_);
  ASSERT_TRUE(shape.is_ok());
  // Room for two replicas, not three.
  const ReplicaWorker rw = replica_worker("replica");
  const std::string &es = rw.slice, &dir = rw.dir, &mb = rw.mb;
  const uint64_t one = rw.one;
  const uint32_t n_embd = shape->n_embd;
  {
    WorkerProcess w(es, "*:4-7", {"--replica-dir", dir, "--replica-mb", mb});
    ASSERT_NE(w.port(), 0) << "worker did not start; output:\n" << w.output();
    auto c = connect_backbone(w.port(), *file_, wire::kFeatureFetch | wire::kFeatureStore);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    ASSERT_NE(c->session.features & wire::kFeatureStore, 0u);
    // Not held yet: refused.
    Request r = make_request(c->mux->next_request_id(), 1, {{{2, 0.7f}, {5, 0.3f}}, {{2, 1.0f}}},
                             wire::CombineMode::kExact, n_embd);
    {
      auto frame = wire::encode_dispatch(r.msg);
      ASSERT_TRUE(c->mux->start(r.msg.request_id, *frame, net::deadline_in(5s)).is_ok());
      auto got = c->mux->wait(r.msg.request_id, net::deadline_in(10s));
      ASSERT_FALSE(got.is_ok());
      EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << got.status().to_string();
    }
    auto st = store(*c, slab(1, 2));
    ASSERT_TRUE(st.is_ok()) << st.status().to_string();
    EXPECT_EQ(st->replica_bytes, one);
    // Now it computes layer 1 expert 2: the bits of expert_ffn on the model.
    r.msg.request_id = c->mux->next_request_id();
    {
      auto frame = wire::encode_dispatch(r.msg);
      ASSERT_TRUE(c->mux->start(r.msg.request_id, *frame, net::deadline_in(5s)).is_ok());
      auto got = c->mux->wait(r.msg.request_id, net::deadline_in(10s));
      ASSERT_TRUE(got.is_ok()) << got.status().to_string();
      const std::vector<float> rows = decode_combine_rows(r, *got, c->session);
      const std::vector<float> want = local_exact(*local_, r, n_embd);
      ASSERT_EQ(rows.size(), want.size());
      EXPECT_EQ(std::memcmp(rows.data(), want.data(), rows.size() * 4), 0);
    }
    // Storing what is held already answers at once and costs nothing.
    auto again = store(*c, slab(1, 5));
    ASSERT_TRUE(again.is_ok()) << again.status().to_string();
    EXPECT_EQ(again->replica_bytes, one);
    // Bytes that are not the model's, resealed with a matching transfer hash: refused.
    wire::SlabMsg fake = slab(0, 1);
    fake.tensors[1].bytes[3] ^= 0x20;
    fake.tensors[1].hash = slab_hash(fake.tensors[1].bytes.data(), fake.tensors[1].bytes.size());
    auto lie = store(*c, fake);
    ASSERT_FALSE(lie.is_ok());
    EXPECT_EQ(lie.status().code(), StatusCode::kCorrupt) << lie.status().to_string();
    EXPECT_NE(lie.status().message().find("not the model's weights"), std::string::npos) << lie.status().message();
    // A second one fits, a third is over the budget.
    ASSERT_TRUE(store(*c, slab(0, 1)).is_ok());
    auto over = store(*c, slab(0, 2));
    ASSERT_FALSE(over.is_ok());
    EXPECT_EQ(over.status().code(), StatusCode::kUnavailable) << over.status().to_string();
    EXPECT_NE(over.status().message().find("exceed the replica budget"), std::string::npos) << over.status().message();
    // A backbone that did not offer STORE cannot use it.
    auto plain = connect_backbone(w.port(), *file_, wire::kFeatureFetch);
    ASSERT_TRUE(plain.is_ok());
    auto refused = store(*plain, slab(0, 3));
    ASSERT_FALSE(refused.is_ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kUnsupported) << refused.status().to_string();
    // The replica is served to FETCH too, byte for byte.
    auto copy = fetch(*c, 0, 1);
    ASSERT_TRUE(copy.is_ok()) << copy.status().to_string();
    EXPECT_EQ(copy->tensors[2].bytes, slab(0, 1).tensors[2].bytes);
  }
  // Restarted on the same folder: both replicas are mapped again and announced.
  EXPECT_TRUE(std::filesystem::exists(dir + "/replica-1-2.gguf"));
  WorkerProcess w2(es, "*:4-7", {"--replica-dir", dir, "--replica-mb", mb});
  ASSERT_NE(w2.port(), 0) << "worker did not restart; output:\n" << w2.output();
  EXPECT_NE(w2.output().find("replicas: up to"), std::string::npos) << w2.output();
  auto c2 = connect_backbone(w2.port(), *file_, wire::kFeatureFetch | wire::kFeatureStore);
  ASSERT_TRUE(c2.is_ok()) << c2.status().to_string();
  auto held = expert_set_from_ranges(c2->session.peer.experts, *shape);
  ASSERT_TRUE(held.is_ok());
  EXPECT_TRUE(held->holds(1, 2));
  EXPECT_TRUE(held->holds(0, 1));
  EXPECT_FALSE(held->holds(0, 2));
  EXPECT_EQ(held->n_pairs(), 2 * 4 + 2u);
}

TEST_F(WorkerProcessTest, ReplicasAreLetGoOfWhileFetchesAndDispatchesRun) {
  auto shape = model_shape(*file_);
  ASSERT_TRUE(shape.is_ok());
  // Room for two replicas, not three: a dropped one frees its room.
  const ReplicaWorker rw = replica_worker("unstore");
  const std::string &es = rw.slice, &dir = rw.dir, &mb = rw.mb;
  const uint64_t one = rw.one;
  const uint32_t n_embd = shape->n_embd;
  const uint32_t both = wire::kFeatureFetch | wire::kFeatureStore | wire::kFeatureUnstore;
  {
    WorkerProcess w(es, "*:4-7", {"--replica-dir", dir, "--replica-mb", mb});
    ASSERT_NE(w.port(), 0) << "worker did not start; output:\n" << w.output();
    auto c = connect_backbone(w.port(), *file_, both);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    ASSERT_NE(c->session.features & wire::kFeatureUnstore, 0u);
    ASSERT_TRUE(store(*c, slab(1, 2)).is_ok());
    ASSERT_TRUE(store(*c, slab(0, 1)).is_ok());
    EXPECT_FALSE(store(*c, slab(0, 2)).is_ok());  // full
    ASSERT_TRUE(std::filesystem::exists(dir + "/replica-1-2.gguf"));

    // A second backbone FETCHes and DISPATCHes layer 1 expert 2 in a loop while the first one
    // drops it: every answer is the model's bytes / bits or NOT_HELD, never anything else (a
    // FETCH or pass reading an unmapped replica would crash the worker).
    auto c2 = connect_backbone(w.port(), *file_, both);
    ASSERT_TRUE(c2.is_ok()) << c2.status().to_string();
    std::atomic<bool> done{false};
    std::atomic<int> served{0}, not_held{0}, other{0};
    const wire::SlabMsg want12 = slab(1, 2);
    std::thread reader([&] {
      while (!done.load()) {
        auto f = fetch(*c2, 1, 2);
        if (f.is_ok()) {
          (f->tensors[0].bytes == want12.tensors[0].bytes && f->tensors[2].bytes == want12.tensors[2].bytes ? served
                                                                                                            : other)++;
        } else {
          (f.status().code() == StatusCode::kNotFound ? not_held : other)++;
        }
        Request r =
            make_request(c2->mux->next_request_id(), 1, {{{2, 0.6f}, {5, 0.4f}}}, wire::CombineMode::kExact, n_embd);
        auto frame = wire::encode_dispatch(r.msg);
        if (!c2->mux->start(r.msg.request_id, *frame, net::deadline_in(5s)).is_ok()) {
          other++;
          continue;
        }
        auto got = c2->mux->wait(r.msg.request_id, net::deadline_in(10s));
        if (got.is_ok()) {
          const std::vector<float> rows = decode_combine_rows(r, *got, c2->session);
          const std::vector<float> want = local_exact(*local_, r, n_embd);
          (rows.size() == want.size() && std::memcmp(rows.data(), want.data(), rows.size() * 4) == 0 ? served
                                                                                                     : other)++;
        } else {
          (got.status().code() == StatusCode::kNotFound ? not_held : other)++;
        }
      }
    });
    auto wait_for = [](const std::atomic<int>& n, int at_least) {
      const auto until = net::deadline_in(30s);
      while (n.load() < at_least && net::Clock::now() < until) std::this_thread::sleep_for(1ms);
      return n.load() >= at_least;
    };
    const bool some_served = wait_for(served, 4);
    auto gone = unstore(*c, 1, 2);
    const bool some_refused = wait_for(not_held, 4);
    done = true;
    reader.join();
    EXPECT_TRUE(some_served);
    EXPECT_TRUE(some_refused);
    ASSERT_TRUE(gone.is_ok()) << gone.status().to_string();
    EXPECT_EQ(gone->replica_bytes, one);  // the other replica's
    EXPECT_EQ(other.load(), 0);
    EXPECT_FALSE(std::filesystem::exists(dir + "/replica-1-2.gguf"));
    EXPECT_TRUE(std::filesystem::exists(dir + "/replica-0-1.gguf"));

    // Refusals, by name: not held, the worker's own file's, not negotiated.
    auto twice = unstore(*c, 1, 2);
    ASSERT_FALSE(twice.is_ok());
    EXPECT_EQ(twice.status().code(), StatusCode::kNotFound) << twice.status().to_string();
    auto own = unstore(*c, 1, 5);
    ASSERT_FALSE(own.is_ok());
    EXPECT_EQ(own.status().code(), StatusCode::kUnsupported) << own.status().to_string();
    EXPECT_NE(own.status().message().find("not a replica"), std::string::npos) << own.status().message();
    auto plain = connect_backbone(w.port(), *file_, wire::kFeatureFetch | wire::kFeatureStore);
    ASSERT_TRUE(plain.is_ok());
    auto refused = unstore(*plain, 0, 1);
    ASSERT_FALSE(refused.is_ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kUnsupported) << refused.status().to_string();
    // Its own experts still compute, and the freed room takes another replica.
    ASSERT_TRUE(fetch(*c, 1, 5).is_ok());
    auto room = store(*c, slab(0, 2));
    ASSERT_TRUE(room.is_ok()) << room.status().to_string();
    EXPECT_EQ(room->replica_bytes, 2 * one);
    // A backbone connecting now is told what is held: not the dropped one.
    auto late = connect_backbone(w.port(), *file_, both);
    ASSERT_TRUE(late.is_ok());
    auto held = expert_set_from_ranges(late->session.peer.experts, *shape);
    ASSERT_TRUE(held.is_ok());
    EXPECT_FALSE(held->holds(1, 2));
    EXPECT_TRUE(held->holds(0, 1));
    EXPECT_TRUE(held->holds(0, 2));
  }
  // Restarted on the same folder: the dropped replica stays gone.
  WorkerProcess w2(es, "*:4-7", {"--replica-dir", dir, "--replica-mb", mb});
  ASSERT_NE(w2.port(), 0) << "worker did not restart; output:\n" << w2.output();
  auto c3 = connect_backbone(w2.port(), *file_, both);
  ASSERT_TRUE(c3.is_ok()) << c3.status().to_string();
  auto held = expert_set_from_ranges(c3->session.peer.experts, *shape);
  ASSERT_TRUE(held.is_ok());
  EXPECT_FALSE(held->holds(1, 2));
  EXPECT_EQ(held->n_pairs(), 2 * 4 + 2u);
}

TEST_F(WorkerProcessTest, ConcurrentBackbonesGetTheirOwnResults) {
  WorkerProcess w(path_, "*:*");
  ASSERT_NE(w.port(), 0) << "worker did not start; output:\n" << w.output();
  const uint32_t n_embd = 64;
  constexpr int kClients = 3, kRequests = 12;
  std::vector<std::thread> threads;
  std::atomic<int> n_ok{0};
  for (int ci = 0; ci < kClients; ++ci) {
    threads.emplace_back([&, ci] {
      auto c = connect_backbone(w.port(), *file_);
      ASSERT_TRUE(c.is_ok()) << c.status().to_string();
      for (int i = 0; i < kRequests; ++i) {
        // Ids from disjoint ranges per client, so the data (seeded by id) names its sender.
        const uint64_t id = 1000 * (ci + 1) + i;
        const uint16_t e0 = static_cast<uint16_t>((ci + i) % 8), e1 = static_cast<uint16_t>((ci + 3 * i + 1) % 8);
        std::vector<std::vector<std::pair<uint16_t, float>>> toks = {{{e0, 0.6f}}, {{e1, 0.4f}}};
        if (e0 != e1) toks.push_back({{e0, 0.5f}, {e1, 0.5f}});
        Request r = make_request(id, static_cast<uint32_t>(i % 2), toks, wire::CombineMode::kExact, n_embd);
        ASSERT_TRUE(c->mux->start(id, *wire::encode_dispatch(r.msg), net::deadline_in(5s)).is_ok());
        auto f = c->mux->wait(id, net::deadline_in(10s));
        ASSERT_TRUE(f.is_ok()) << f.status().to_string();
        const std::vector<float> got = decode_combine_rows(r, *f, c->session);
        const std::vector<float> want = local_exact(*local_, r, n_embd);
        ASSERT_EQ(got.size(), want.size());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "client " << ci << " request " << i;
        n_ok.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(n_ok.load(), kClients * kRequests);
}

}  // namespace
}  // namespace moesh::swarm
