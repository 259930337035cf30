// The work ledger as JSON (GET /swarm/ledger on the gateway and on a worker's --metrics port,
// `moesh swarm ledger`), and the check that a backbone's and its workers' accounts agree.
//
// Document: {"role": "backbone"|"worker", "name": NAME, "peers": [ENTRY...]}, one ENTRY per
// swarm::LedgerEntry with the same field names. A market settles on these: both sides count the
// same frames, so in a run without failures the counted fields agree exactly (kAgreeFields).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "moesh/remote/remote.h"
#include "moesh/remote/span_client.h"
#include "moesh/swarm/swarm.h"
#include "moesh/util/status.h"

namespace moesh::serve {

nlohmann::json ledger_json(std::string_view role, std::string_view name, const std::vector<swarm::LedgerEntry>& peers);
// Parses a ledger document (kInvalidArgument naming what is missing or mistyped).
struct LedgerDoc {
  std::string role, name;
  std::vector<swarm::LedgerEntry> peers;
};
Result<LedgerDoc> parse_ledger(const nlohmann::json& j);

// The counted fields both sides keep: requests, dispatches, pairs, tokens, dispatch_bytes,
// combine_bytes, fetches, fetch_bytes.
inline constexpr const char* kAgreeFields[] = {"requests",       "dispatches",    "pairs",   "tokens",
                                               "dispatch_bytes", "combine_bytes", "fetches", "fetch_bytes"};

// One worker compared with the backbone's entry for it: each field's two values.
struct LedgerCheck {
  std::string worker;
  bool found_on_backbone = false;  // the backbone has an entry named like the worker
  bool found_on_worker = false;    // the worker has an entry named like the backbone
  struct Field {
    std::string name;
    uint64_t backbone = 0, worker = 0;
  };
  std::vector<Field> fields;
  bool agrees() const;
};
// `backbone` must have role "backbone", each of `workers` role "worker"
// (kInvalidArgument otherwise).
Result<std::vector<LedgerCheck>> check_ledgers(const LedgerDoc& backbone, const std::vector<LedgerDoc>& workers);
// GET /swarm/status: {"backbone": NAME, "accepting": PORT or null, "workers": [{index, label,
// name, path, address, state, experts, n_experts, warmup_rtt_ms, min_latency_ms,
// mean_latency_ms, last_heard_s, requests, errors, rejoins, failovers}], "joins": [{name,
// address, experts, joins, held, warmup_rtt_ms, since_join_s}], "refused_joins": N,
// "last_refusal": TEXT, "spans": [{layers, label, state ("up", or "here" when the backbone runs
// them), address, warmup_rtt_ms, min_trip_ms, trips, slab_bytes, mem_total_bytes,
// mem_available_bytes, offer_bytes, replica_budget_bytes}]}. `remote` null: no workers; `spans`
// null: no span peers.
nlohmann::json swarm_status_json(const RemoteExecutor* remote, const SpanClient* spans = nullptr);
// The table `moesh swarm status` prints from that document.
std::string render_swarm_status(const nlohmann::json& status);

// A fixed-width table of the checks, one row per (worker, field), ending "ledger: AGREE" or
// "ledger: DIFFER (N fields)".
std::string render_ledger_checks(const std::vector<LedgerCheck>& checks);

}  // namespace moesh::serve
