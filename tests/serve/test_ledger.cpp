// The work ledger's JSON form and the two-sided check (serve/ledger.h): round trip, agreement,
// a differing count, a missing entry, documents of the wrong role, malformed documents.
#include <gtest/gtest.h>

#include "moesh/serve/ledger.h"

namespace moesh::serve {
namespace {

swarm::LedgerEntry entry(const std::string& peer, uint64_t n) {
  swarm::LedgerEntry e;
  e.peer = peer;
  e.address = "127.0.0.1:1";
  e.requests = n;
  e.dispatches = n;
  e.pairs = 2 * n;
  e.tokens = n;
  e.dispatch_bytes = 100 * n;
  e.combine_bytes = 120 * n;
  e.fetches = 1;
  e.fetch_bytes = 4096;
  e.compute_seconds = 0.25;
  e.connected_seconds = 3.5;
  e.connected = true;
  return e;
}

LedgerDoc doc(const nlohmann::json& j) {
  auto d = parse_ledger(j);
  EXPECT_TRUE(d.is_ok()) << d.status().to_string();
  return d.is_ok() ? *d : LedgerDoc{};
}

TEST(Ledger, JsonRoundTripKeepsEveryField) {
  swarm::LedgerEntry e = entry("w1", 7);
  e.errors = 2;
  e.verified = 3;
  e.mismatches = 1;
  const LedgerDoc d = doc(ledger_json("backbone", "gw", {e}));
  EXPECT_EQ(d.role, "backbone");
  EXPECT_EQ(d.name, "gw");
  ASSERT_EQ(d.peers.size(), 1u);
  const swarm::LedgerEntry& g = d.peers[0];
  EXPECT_EQ(g.peer, "w1");
  EXPECT_EQ(g.address, e.address);
  EXPECT_EQ(g.requests, 7u);
  EXPECT_EQ(g.pairs, 14u);
  EXPECT_EQ(g.dispatch_bytes, 700u);
  EXPECT_EQ(g.combine_bytes, 840u);
  EXPECT_EQ(g.errors, 2u);
  EXPECT_EQ(g.verified, 3u);
  EXPECT_EQ(g.mismatches, 1u);
  EXPECT_EQ(g.fetch_bytes, 4096u);
  EXPECT_DOUBLE_EQ(g.compute_seconds, 0.25);
  EXPECT_DOUBLE_EQ(g.connected_seconds, 3.5);
  EXPECT_TRUE(g.connected);
}

TEST(Ledger, CheckAgreesAndFindsEveryDifference) {
  const LedgerDoc gw = doc(ledger_json("backbone", "gw", {entry("w1", 5), entry("w2", 9)}));
  const LedgerDoc w1 = doc(ledger_json("worker", "w1", {entry("other-gw", 1), entry("gw", 5)}));
  swarm::LedgerEntry off = entry("gw", 9);
  off.combine_bytes += 1;  // one byte the backbone did not count
  const LedgerDoc w2 = doc(ledger_json("worker", "w2", {off}));

  auto ok = check_ledgers(gw, {w1});
  ASSERT_TRUE(ok.is_ok());
  ASSERT_EQ(ok->size(), 1u);
  EXPECT_TRUE((*ok)[0].agrees());
  EXPECT_NE(render_ledger_checks(*ok).find("ledger: AGREE"), std::string::npos);

  auto bad = check_ledgers(gw, {w1, w2});
  ASSERT_TRUE(bad.is_ok());
  EXPECT_TRUE((*bad)[0].agrees());
  EXPECT_FALSE((*bad)[1].agrees());
  const std::string table = render_ledger_checks(*bad);
  EXPECT_NE(table.find("ledger: DIFFER (1 fields)"), std::string::npos) << table;
  EXPECT_NE(table.find("combine_bytes"), std::string::npos) << table;
}

TEST(Ledger, MissingEntriesAndWrongRolesAreReported) {
  const LedgerDoc gw = doc(ledger_json("backbone", "gw", {entry("w1", 5)}));
  const LedgerDoc stranger = doc(ledger_json("worker", "w3", {entry("gw", 5)}));
  const LedgerDoc unaware = doc(ledger_json("worker", "w1", {entry("someone-else", 5)}));
  auto c = check_ledgers(gw, {stranger, unaware});
  ASSERT_TRUE(c.is_ok());
  EXPECT_FALSE((*c)[0].found_on_backbone);
  EXPECT_FALSE((*c)[0].agrees());
  EXPECT_TRUE((*c)[1].found_on_backbone);
  EXPECT_FALSE((*c)[1].found_on_worker);
  const std::string table = render_ledger_checks(*c);
  EXPECT_NE(table.find("the backbone has no entry for this worker"), std::string::npos) << table;
  EXPECT_NE(table.find("this worker has no entry for the backbone"), std::string::npos) << table;

  auto swapped = check_ledgers(stranger, {gw});
  ASSERT_FALSE(swapped.is_ok());
  EXPECT_NE(swapped.status().message().find("not a backbone's"), std::string::npos);
  auto two_gw = check_ledgers(gw, {gw});
  ASSERT_FALSE(two_gw.is_ok());
  EXPECT_NE(two_gw.status().message().find("not a worker's"), std::string::npos);
}

TEST(Ledger, MalformedDocumentsNameTheProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"[1,2]", "not a JSON object"},
      {R"({"name":"x","peers":[]})", "\"role\""},
      {R"({"role":"worker","peers":[]})", "\"name\""},
      {R"({"role":"worker","name":"x"})", "\"peers\""},
      {R"({"role":"worker","name":"x","peers":[{"requests":1}]})", "peers[0] has no \"peer\""},
      {R"({"role":"worker","name":"x","peers":[{"peer":"b","pairs":-3}]})", "peers[0].pairs is not a count"},
      {R"({"role":"worker","name":"x","peers":[{"peer":"b","tokens":"7"}]})", "peers[0].tokens is not a count"},
  };
  for (const auto& [text, want] : cases) {
    auto d = parse_ledger(nlohmann::json::parse(text));
    ASSERT_FALSE(d.is_ok()) << text;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(d.status().message().find(want), std::string::npos) << text << ": " << d.status().message();
  }
}

}  // namespace
}  // namespace moesh::serve
