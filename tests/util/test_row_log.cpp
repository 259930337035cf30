// util/row_log.h: rows read back are the rows appended, bit for bit, whether they stayed in memory,
// went to the spill file, were shared by a prefix or cut by a truncate; the memory budget holds;
// freed file slots are reused; a spill that cannot happen keeps the rows in memory.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <random>

#include "moesh/util/row_log.h"

namespace moesh {
namespace {

constexpr int64_t kW = 5;  // floats per row

// Row r of "stream" s: distinct bit patterns, NaN payloads and negative zero included.
std::vector<float> rows_of(int s, int64_t first, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n * kW));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < kW; ++j) {
      const uint32_t bits = static_cast<uint32_t>(s * 1000003 + (first + r) * 131 + j * 7) ^
                            (j == 3 ? 0x7fc00001u : 0u) ^ (j == 4 ? 0x80000000u : 0u);
      std::memcpy(&v[static_cast<size_t>(r * kW + j)], &bits, 4);
    }
  }
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::vector<float> read_all(const RowLog& l) {
  std::vector<float> v(static_cast<size_t>(l.size() * kW));
  Status st = l.read(0, l.size(), v.data());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return v;
}

std::shared_ptr<RowStore> store(size_t budget, int64_t chunk_rows = 4, std::string dir = "") {
  RowStoreOptions o;
  o.row_floats = kW;
  o.chunk_rows = chunk_rows;
  o.memory_budget = budget;
  o.spill_dir = std::move(dir);
  return RowStore::create(o);
}

TEST(RowLog, AppendsAndReadsAcrossChunksInMemory) {
  auto s = store(SIZE_MAX);
  RowLog l(s);
  const auto a = rows_of(1, 0, 3), b = rows_of(1, 3, 7);
  ASSERT_TRUE(l.append(a.data(), 3).is_ok());
  ASSERT_TRUE(l.append(b.data(), 7).is_ok());
  EXPECT_EQ(l.size(), 10);
  EXPECT_TRUE(same_bits(read_all(l), rows_of(1, 0, 10)));
  std::vector<float> mid(static_cast<size_t>(5 * kW));
  ASSERT_TRUE(l.read(2, 5, mid.data()).is_ok());
  EXPECT_TRUE(same_bits(mid, rows_of(1, 2, 5)));
  Status st = l.read(8, 3, mid.data());
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
  EXPECT_EQ(s->stats().memory_bytes, 10 * kW * sizeof(float));
  EXPECT_EQ(s->stats().spilled_chunks, 0u);
}

TEST(RowLog, FullChunksPastTheBudgetGoToTheFileAndReadBackBitForBit) {
  const size_t chunk = 4 * kW * sizeof(float);
  auto s = store(2 * chunk);
  RowLog l(s);
  const auto rows = rows_of(2, 0, 30);
  ASSERT_TRUE(l.append(rows.data(), 30).is_ok());
  const RowStoreStats st = s->stats();
  EXPECT_LE(st.memory_bytes, 2 * chunk);
  EXPECT_EQ(st.memory_bytes + st.file_bytes, 30 * kW * sizeof(float));
  EXPECT_EQ(st.spilled_chunks, 6u);  // 7 full chunks and a half: one full one fits beside the half
  EXPECT_TRUE(st.spill_error.empty()) << st.spill_error;
  EXPECT_TRUE(same_bits(read_all(l), rows));
  EXPECT_GT(s->stats().read_back_chunks, 0u);
}

TEST(RowLog, TruncateIntoASpilledChunkThenAppendKeepsTheRightRows) {
  auto s = store(0);  // every full chunk goes to the file
  RowLog l(s);
  const auto rows = rows_of(3, 0, 12);
  ASSERT_TRUE(l.append(rows.data(), 12).is_ok());
  EXPECT_EQ(s->stats().memory_bytes, 0u);
  l.truncate(6);  // into chunk 1 (rows 4..7), which is in the file
  const auto other = rows_of(4, 6, 5);
  ASSERT_TRUE(l.append(other.data(), 5).is_ok());
  std::vector<float> want = rows_of(3, 0, 6);
  want.insert(want.end(), other.begin(), other.end());
  EXPECT_TRUE(same_bits(read_all(l), want));
  l.truncate(0);
  EXPECT_EQ(l.size(), 0);
  const RowStoreStats st = s->stats();
  EXPECT_EQ(st.memory_bytes, 0u);
  EXPECT_EQ(st.file_bytes, 0u);
}

TEST(RowLog, PrefixesShareChunksAndCopyBeforeWriting) {
  auto s = store(SIZE_MAX);
  RowLog a(s);
  const auto rows = rows_of(5, 0, 10);
  ASSERT_TRUE(a.append(rows.data(), 10).is_ok());
  const size_t before = s->stats().memory_bytes;
  RowLog b = a.prefix(6);
  EXPECT_EQ(s->stats().memory_bytes, before);  // no row copied
  RowLog c = a.prefix(10);
  const auto tb = rows_of(6, 6, 3), ta = rows_of(7, 10, 2), tc = rows_of(8, 10, 4);
  ASSERT_TRUE(b.append(tb.data(), 3).is_ok());  // b's chunk 1 is shared: copied first
  ASSERT_TRUE(a.append(ta.data(), 2).is_ok());  // a at the frontier appends in place
  ASSERT_TRUE(c.append(tc.data(), 4).is_ok());  // c no longer at it: copies
  auto cat = [](std::vector<float> x, const std::vector<float>& y) {
    x.insert(x.end(), y.begin(), y.end());
    return x;
  };
  EXPECT_TRUE(same_bits(read_all(a), cat(rows, ta)));
  EXPECT_TRUE(same_bits(read_all(b), cat(rows_of(5, 0, 6), tb)));
  EXPECT_TRUE(same_bits(read_all(c), cat(rows, tc)));
  RowLog empty = a.prefix(0);
  EXPECT_EQ(empty.size(), 0);
  EXPECT_EQ(a.prefix(99).size(), a.size());
}

TEST(RowLog, DroppedLogsFreeTheirMemoryAndFileSlotsForReuse) {
  auto s = store(0);
  for (int round = 0; round < 5; ++round) {
    RowLog l(s);
    const auto rows = rows_of(round, 0, 16);
    ASSERT_TRUE(l.append(rows.data(), 16).is_ok());
    EXPECT_TRUE(same_bits(read_all(l), rows));
  }
  const RowStoreStats st = s->stats();
  EXPECT_EQ(st.memory_bytes, 0u);
  EXPECT_EQ(st.file_bytes, 0u);
  EXPECT_EQ(st.file_size, 4 * 4 * kW * sizeof(float));  // one log's 4 chunks, reused each round
  EXPECT_EQ(st.spilled_chunks, 20u);
}

TEST(RowLog, ASpillThatCannotHappenKeepsTheRowsInMemory) {
  auto s = store(0, 4, "/nonexistent/moesh-row-log");
  RowLog l(s);
  const auto rows = rows_of(9, 0, 12);
  ASSERT_TRUE(l.append(rows.data(), 12).is_ok());
  const RowStoreStats st = s->stats();
  EXPECT_NE(st.spill_error.find("/nonexistent/moesh-row-log"), std::string::npos) << st.spill_error;
  EXPECT_EQ(st.memory_bytes, 12 * kW * sizeof(float));
  EXPECT_TRUE(same_bits(read_all(l), rows));
}

TEST(RowLog, TheSpillFileLeavesNoNameBehind) {
  char dir[] = "/tmp/moesh-rowlog-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  {
    auto s = store(0, 2, dir);
    RowLog l(s);
    const auto rows = rows_of(1, 0, 8);
    ASSERT_TRUE(l.append(rows.data(), 8).is_ok());
    EXPECT_GT(s->stats().file_bytes, 0u);
    int names = 0;
    DIR* d = ::opendir(dir);
    ASSERT_NE(d, nullptr);
    while (dirent* e = ::readdir(d)) names += std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0;
    ::closedir(d);
    EXPECT_EQ(names, 0) << "the spill file has a name in " << dir;
    EXPECT_TRUE(same_bits(read_all(l), rows));
  }
  EXPECT_EQ(::rmdir(dir), 0);
}

// Random appends, truncates, prefixes and drops against plain vectors, with a budget small enough
// that most chunks live in the file.
TEST(RowLog, RandomOperationsMatchAPlainVector) {
  std::mt19937 rng(1234);
  for (size_t budget : {size_t{0}, size_t{3 * 3 * kW * sizeof(float)}, SIZE_MAX}) {
    auto s = store(budget, 3);
    std::vector<RowLog> logs;
    std::vector<std::vector<float>> want;
    int stream = 0;
    for (int op = 0; op < 600; ++op) {
      const int kind = static_cast<int>(rng() % 10);
      if (logs.empty() || kind == 0) {
        logs.emplace_back(s);
        want.emplace_back();
        continue;
      }
      const size_t i = rng() % logs.size();
      RowLog& l = logs[i];
      if (kind <= 4) {
        const int64_t n = 1 + static_cast<int64_t>(rng() % 7);
        const auto rows = rows_of(++stream, 0, n);
        ASSERT_TRUE(l.append(rows.data(), n).is_ok());
        want[i].insert(want[i].end(), rows.begin(), rows.end());
      } else if (kind <= 6) {
        const int64_t n = static_cast<int64_t>(rng() % static_cast<uint32_t>(l.size() + 2));
        l.truncate(n);
        want[i].resize(static_cast<size_t>(std::min<int64_t>(n, static_cast<int64_t>(want[i].size()) / kW) * kW));
      } else if (kind <= 8) {
        const int64_t n = static_cast<int64_t>(rng() % static_cast<uint32_t>(l.size() + 1));
        logs.push_back(l.prefix(n));
        want.emplace_back(want[i].begin(), want[i].begin() + n * kW);
      } else {
        logs.erase(logs.begin() + static_cast<ptrdiff_t>(i));
        want.erase(want.begin() + static_cast<ptrdiff_t>(i));
      }
      for (size_t j = 0; j < logs.size(); ++j) {
        ASSERT_EQ(logs[j].size() * kW, static_cast<int64_t>(want[j].size())) << "op " << op;
        ASSERT_TRUE(same_bits(read_all(logs[j]), want[j])) << "op " << op << " log " << j << " budget " << budget;
      }
      // In memory past the budget: at most each log's partly filled last chunk.
      if (budget != SIZE_MAX) {
        ASSERT_LE(s->stats().memory_bytes, budget + logs.size() * 3 * kW * sizeof(float)) << "op " << op;
      }
    }
    if (budget != SIZE_MAX) {  // the file was used, rows were read back from it and cut chunks restored
      EXPECT_GT(s->stats().spilled_chunks, 50u);
      EXPECT_GT(s->stats().read_back_chunks, 50u);
    } else {
      EXPECT_EQ(s->stats().spilled_chunks, 0u);
    }
    logs.clear();
    EXPECT_EQ(s->stats().memory_bytes, 0u);
    EXPECT_EQ(s->stats().file_bytes, 0u);
  }
}

}  // namespace
}  // namespace moesh
