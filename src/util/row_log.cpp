#include "moesh/util/row_log.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace moesh {

// A chunk's rows live either in `data` (resident) or in file slot `slot` (spilled, data empty).
// A spilled chunk is always full: only full chunks are spilled, and a cut one is read back first.
struct RowStore::Chunk {
  std::vector<float> data;
  int64_t rows = 0;   // rows written to it (by the log at its frontier)
  int64_t slot = -1;  // file slot while spilled
  bool tracked = false;
  std::list<Chunk*>::iterator it;
};

std::shared_ptr<RowStore> RowStore::create(const RowStoreOptions& o) {
  RowStoreOptions v = o;
  v.row_floats = std::max<int64_t>(v.row_floats, 1);
  v.chunk_rows = std::max<int64_t>(v.chunk_rows, 1);
  return std::shared_ptr<RowStore>(new RowStore(v));
}

RowStore::RowStore(const RowStoreOptions& o) : o_(o) {}

RowStore::~RowStore() {
  if (fd_ >= 0) ::close(fd_);
}

size_t RowStore::chunk_bytes() const {
  return static_cast<size_t>(o_.chunk_rows) * static_cast<size_t>(o_.row_floats) * sizeof(float);
}

RowStoreStats RowStore::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  RowStoreStats s;
  s.memory_bytes = memory_bytes_;
  s.file_bytes = static_cast<size_t>(used_slots_) * chunk_bytes();
  s.file_size = static_cast<size_t>(n_slots_) * chunk_bytes();
  s.spilled_chunks = spilled_;
  s.read_back_chunks = read_back_;
  s.spill_error = spill_error_;
  return s;
}

void RowStore::track(Chunk* c) {
  if (c->tracked || c->slot >= 0) return;
  c->it = spillable_.insert(spillable_.end(), c);
  c->tracked = true;
}

void RowStore::untrack(Chunk* c) {
  if (!c->tracked) return;
  spillable_.erase(c->it);
  c->tracked = false;
}

void RowStore::forget(Chunk* c) {
  untrack(c);
  if (c->slot >= 0) {
    free_slots_.push_back(c->slot);
    --used_slots_;
    c->slot = -1;
  } else {
    memory_bytes_ -= c->data.size() * sizeof(float);
    c->data.clear();
  }
}

namespace {

// The directory the spill file goes to: the option, else $TMPDIR, else /var/tmp (on disk on
// distributions where /tmp is a tmpfs, i.e. memory — the very thing the file saves).
std::string spill_directory(const std::string& opt) {
  if (!opt.empty()) return opt;
  const char* t = std::getenv("TMPDIR");
  return t != nullptr && *t != '\0' ? t : "/var/tmp";
}

Status open_unlinked(const std::string& dir, int* fd) {
#ifdef O_TMPFILE
  *fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (*fd >= 0) return Status::ok();
    // Filesystems without O_TMPFILE: a named file, unlinked at once.
#endif
  std::string path = dir + "/moesh-rowlog-XXXXXX";
  *fd = ::mkstemp(path.data());
  if (*fd < 0) {
    return make_error(StatusCode::kIoError, "cannot make a spill file in {}: {}", dir, std::strerror(errno));
  }
  ::unlink(path.c_str());
  ::fcntl(*fd, F_SETFD, FD_CLOEXEC);
  return Status::ok();
}

}  // namespace

Status RowStore::spill(Chunk* c) {
  if (fd_ < 0) {
    const std::string dir = spill_directory(o_.spill_dir);
    MOESH_RETURN_IF_ERROR(open_unlinked(dir, &fd_));
    spdlog::debug("row log: rows past {} bytes go to an unlinked file in {}", o_.memory_budget, dir);
  }
  int64_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = n_slots_++;
  }
  const size_t bytes = chunk_bytes();
  const char* p = reinterpret_cast<const char*>(c->data.data());
  size_t done = 0;
  while (done < bytes) {
    const ssize_t w = ::pwrite(fd_, p + done, bytes - done, static_cast<off_t>(slot * bytes + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      free_slots_.push_back(slot);
      return make_error(StatusCode::kIoError, "writing {} bytes of rows to the spill file: {}", bytes,
                        w < 0 ? std::strerror(errno) : "no progress");
    }
    done += static_cast<size_t>(w);
  }
  untrack(c);
  memory_bytes_ -= c->data.size() * sizeof(float);
  std::vector<float>().swap(c->data);
  c->slot = slot;
  ++used_slots_;
  ++spilled_;
  return Status::ok();
}

void RowStore::enforce_budget() {
  while (memory_bytes_ > o_.memory_budget && !spillable_.empty() && spill_error_.empty()) {
    Status st = spill(spillable_.front());
    if (!st.is_ok()) {
      spill_error_ = st.message();
      spdlog::warn("row log: {}; rows past the memory budget stay in memory", spill_error_);
    }
  }
}

Status RowStore::read_rows(const Chunk& c, int64_t first, int64_t n, float* out) {
  const size_t W = static_cast<size_t>(o_.row_floats);
  if (c.slot < 0) {
    std::memcpy(out, c.data.data() + static_cast<size_t>(first) * W, static_cast<size_t>(n) * W * sizeof(float));
    return Status::ok();
  }
  const size_t bytes = static_cast<size_t>(n) * W * sizeof(float);
  const off_t at =
      static_cast<off_t>(static_cast<size_t>(c.slot) * chunk_bytes() + static_cast<size_t>(first) * W * sizeof(float));
  char* p = reinterpret_cast<char*>(out);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t r = ::pread(fd_, p + done, bytes - done, at + static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return make_error(StatusCode::kIoError, "reading {} bytes of rows back from the spill file: {}", bytes,
                        r < 0 ? std::strerror(errno) : "short file");
    }
    done += static_cast<size_t>(r);
  }
  ++read_back_;
  return Status::ok();
}

void RowStore::cut(Chunk* c, int64_t rows) {
  untrack(c);  // no longer full
  const size_t keep = static_cast<size_t>(rows * o_.row_floats);
  memory_bytes_ -= (c->data.size() - keep) * sizeof(float);
  c->data.resize(keep);
  c->rows = rows;
}

Status RowStore::make_resident(Chunk* c) {
  if (c->slot < 0) return Status::ok();
  std::vector<float> data(static_cast<size_t>(c->rows * o_.row_floats));
  MOESH_RETURN_IF_ERROR(read_rows(*c, 0, c->rows, data.data()));
  free_slots_.push_back(c->slot);
  --used_slots_;
  c->slot = -1;
  c->data = std::move(data);
  memory_bytes_ += c->data.size() * sizeof(float);
  return Status::ok();
}

RowLog::RowLog(RowLog&& o) noexcept : store_(std::move(o.store_)), chunks_(std::move(o.chunks_)), n_(o.n_) {
  o.chunks_.clear();
  o.n_ = 0;
}

RowLog& RowLog::operator=(RowLog&& o) noexcept {
  if (this != &o) {
    if (store_) {
      std::lock_guard<std::mutex> lk(store_->mu_);
      release_all();
    }
    store_ = std::move(o.store_);
    chunks_ = std::move(o.chunks_);
    n_ = o.n_;
    o.chunks_.clear();
    o.n_ = 0;
  }
  return *this;
}

RowLog::~RowLog() {
  if (!store_) return;
  std::lock_guard<std::mutex> lk(store_->mu_);
  release_all();
}

void RowLog::release_all() {
  for (auto& c : chunks_) {
    if (c.use_count() == 1) store_->forget(c.get());
  }
  chunks_.clear();
  n_ = 0;
}

Status RowLog::append(const float* rows, int64_t n) {
  if (n <= 0) return Status::ok();
  if (!store_) return make_error(StatusCode::kInternal, "append to a row log without a store");
  std::lock_guard<std::mutex> lk(store_->mu_);
  RowStore& s = *store_;
  const int64_t C = s.o_.chunk_rows;
  const size_t W = static_cast<size_t>(s.o_.row_floats);
  while (n > 0) {
    int64_t have = chunks_.empty() ? C : n_ - static_cast<int64_t>(chunks_.size() - 1) * C;
    if (have == C) {
      chunks_.push_back(std::make_shared<RowStore::Chunk>());
      have = 0;
    }
    std::shared_ptr<RowStore::Chunk>& cp = chunks_.back();
    if (cp->rows != have) {
      // Written past our rows: by a log sharing it (copy ours out), or by us before a truncate.
      if (cp.use_count() == 1) {
        MOESH_RETURN_IF_ERROR(s.make_resident(cp.get()));
        s.cut(cp.get(), have);
      } else {
        auto fresh = std::make_shared<RowStore::Chunk>();
        fresh->data.resize(static_cast<size_t>(have) * W);
        if (have > 0) MOESH_RETURN_IF_ERROR(s.read_rows(*cp, 0, have, fresh->data.data()));
        fresh->rows = have;
        s.memory_bytes_ += fresh->data.size() * sizeof(float);
        cp = std::move(fresh);
      }
    }
    RowStore::Chunk& c = *cp;
    const int64_t take = std::min(n, C - have);
    c.data.insert(c.data.end(), rows, rows + static_cast<size_t>(take) * W);
    s.memory_bytes_ += static_cast<size_t>(take) * W * sizeof(float);
    c.rows += take;
    n_ += take;
    rows += static_cast<size_t>(take) * W;
    n -= take;
    if (c.rows == C) s.track(&c);
  }
  s.enforce_budget();
  return Status::ok();
}

void RowLog::truncate(int64_t n) {
  n = std::max<int64_t>(n, 0);
  if (n >= n_ || !store_) return;
  std::lock_guard<std::mutex> lk(store_->mu_);
  RowStore& s = *store_;
  const int64_t C = s.o_.chunk_rows;
  const size_t keep = static_cast<size_t>((n + C - 1) / C);
  for (size_t i = keep; i < chunks_.size(); ++i) {
    if (chunks_[i].use_count() == 1) s.forget(chunks_[i].get());
  }
  chunks_.resize(keep);
  n_ = n;
  // A resident last chunk we alone hold gives its cut rows back now; a spilled one keeps them in
  // the file until it is appended to.
  if (!chunks_.empty() && chunks_.back().use_count() == 1 && chunks_.back()->slot < 0) {
    RowStore::Chunk& c = *chunks_.back();
    const int64_t have = n - static_cast<int64_t>(keep - 1) * C;
    if (c.rows > have) s.cut(&c, have);
  }
}

Status RowLog::read(int64_t first, int64_t n, float* out) const {
  if (n == 0) return Status::ok();
  if (first < 0 || n < 0 || first + n > n_) {
    return make_error(StatusCode::kOutOfRange, "rows {}..{} asked of a row log of {}", first, first + n, n_);
  }
  std::lock_guard<std::mutex> lk(store_->mu_);
  RowStore& s = *store_;
  const int64_t C = s.o_.chunk_rows;
  const size_t W = static_cast<size_t>(s.o_.row_floats);
  while (n > 0) {
    const RowStore::Chunk& c = *chunks_[static_cast<size_t>(first / C)];
    const int64_t at = first % C;
    const int64_t take = std::min(n, C - at);
    MOESH_RETURN_IF_ERROR(s.read_rows(c, at, take, out));
    out += static_cast<size_t>(take) * W;
    first += take;
    n -= take;
  }
  return Status::ok();
}

RowLog RowLog::prefix(int64_t n) const {
  RowLog out(store_);
  if (!store_) return out;
  std::lock_guard<std::mutex> lk(store_->mu_);
  const int64_t m = std::clamp<int64_t>(n, 0, n_);
  const int64_t C = store_->o_.chunk_rows;
  const size_t keep = static_cast<size_t>((m + C - 1) / C);
  out.chunks_.assign(chunks_.begin(), chunks_.begin() + static_cast<ptrdiff_t>(keep));
  out.n_ = m;
  return out;
}

}  // namespace moesh
