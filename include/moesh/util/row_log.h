// Logs of fixed-width f32 rows that share one memory budget: past the budget, rows move to an
// unlinked temporary file and are read back from it when asked for.
//
// Written for the span client's input log (remote/span_client.h): the backbone keeps every hidden
// row it sent each span so that a replacement peer can be replayed — n_ctx × sequences × spans
// rows of n_embd floats, gigabytes at long contexts and many streams, for data that is read only
// when a peer fails. So old rows may live on disk; the row a step appends stays in memory.
//
// Rows are kept in chunks of a fixed number of rows. Only full chunks go to the file, oldest
// first; a file slot freed by a dropped chunk is reused, so the file holds at most the rows that
// are logged. Logs made by prefix() share chunks (a prefix-cache copy copies no rows); a shared
// chunk is copied before it is written. A spill that fails (disk full, no such directory) keeps
// the rows in memory and is reported in stats(), never as a lost row.
//
// Thread-safe: every operation on a store's logs takes the store's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "moesh/util/status.h"

namespace moesh {

struct RowStoreOptions {
  int64_t row_floats = 1;           // the width of every row
  int64_t chunk_rows = 64;          // rows per chunk: the unit of spilling and sharing
  size_t memory_budget = SIZE_MAX;  // bytes of rows kept in memory; full chunks beyond go to the file
  std::string spill_dir;            // where the file is made; "": $TMPDIR, else /var/tmp
};

struct RowStoreStats {
  size_t memory_bytes = 0;        // rows held in memory
  size_t file_bytes = 0;          // rows held in the file
  size_t file_size = 0;           // the file's size (freed slots included)
  uint64_t spilled_chunks = 0;    // chunks written to the file, ever
  uint64_t read_back_chunks = 0;  // chunk reads from the file, ever
  std::string spill_error;        // why spilling stopped ("" while it works)
};

class RowLog;

class RowStore {
 public:
  static std::shared_ptr<RowStore> create(const RowStoreOptions& o);
  ~RowStore();
  RowStore(const RowStore&) = delete;
  RowStore& operator=(const RowStore&) = delete;

  const RowStoreOptions& options() const { return o_; }
  RowStoreStats stats() const;

 private:
  friend class RowLog;
  struct Chunk;
  explicit RowStore(const RowStoreOptions& o);
  size_t chunk_bytes() const;
  // All below with mu_ held.
  void track(Chunk* c);  // c became full and resident: it may be spilled
  void untrack(Chunk* c);
  void forget(Chunk* c);  // the last reference to c goes: its memory or slot is freed
  void add_memory(Chunk* c, int64_t rows_delta);
  void enforce_budget();
  Status spill(Chunk* c);
  Status read_rows(const Chunk& c, int64_t first, int64_t n, float* out);
  Status make_resident(Chunk* c);    // a spilled chunk read back into memory (its slot freed)
  void cut(Chunk* c, int64_t rows);  // a resident chunk keeps its first `rows` rows

  RowStoreOptions o_;
  mutable std::mutex mu_;
  std::list<Chunk*> spillable_;  // full resident chunks, oldest first
  size_t memory_bytes_ = 0;
  int fd_ = -1;
  std::vector<int64_t> free_slots_;
  int64_t n_slots_ = 0;  // slots the file has
  int64_t used_slots_ = 0;
  uint64_t spilled_ = 0, read_back_ = 0;
  std::string spill_error_;
};

// One log: rows 0..size()-1. Move-only; prefix() is the copy.
class RowLog {
 public:
  RowLog() = default;  // holds nothing; needs a store before append
  explicit RowLog(std::shared_ptr<RowStore> store) : store_(std::move(store)) {}
  RowLog(RowLog&& o) noexcept;
  RowLog& operator=(RowLog&& o) noexcept;
  RowLog(const RowLog&) = delete;
  RowLog& operator=(const RowLog&) = delete;
  ~RowLog();

  int64_t size() const { return n_; }
  // Appends n rows. Fails only when a chunk cut by truncate() and spilled cannot be read back.
  Status append(const float* rows, int64_t n);
  // Keeps the first n rows (n >= size(): nothing).
  void truncate(int64_t n);
  // Rows [first, first + n) into out (n × row_floats); kOutOfRange past size(), kIoError when the
  // file cannot be read.
  Status read(int64_t first, int64_t n, float* out) const;
  // A log of the first min(n, size()) rows, sharing this one's chunks.
  RowLog prefix(int64_t n) const;

 private:
  void release_all();  // with the store's lock held
  std::shared_ptr<RowStore> store_;
  std::vector<std::shared_ptr<RowStore::Chunk>> chunks_;
  int64_t n_ = 0;
};

}  // namespace moesh
