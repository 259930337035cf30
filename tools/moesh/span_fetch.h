// Fetching the span slice of some blocks from a gateway (`moesh span --fetch`, `moesh worker
// --fetch-blocks`): what a peer that does not hold the full model loads blocks from.
#pragma once

#include <httplib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "http_cli.h"
#include "moesh/model/model.h"
#include "moesh/swarm/swarm.h"

namespace moesh::cli {

struct SliceFetch {
  std::string gateway;    // http://HOST:PORT of `moesh serve --admin-key`
  std::string admin_key;  // its --admin-key
  std::string dir;        // where slices are kept ("": $TMPDIR, else /var/tmp)
  const char* cmd = "span";
};

// Downloads the span slice of blocks `sp` from a gateway (`GET /swarm/slice`) into a.dir (a
// .part file renamed into place only once its XXH3-128 equals the one the gateway sent), so the
// peer runs exactly the weights the gateway's file holds. Returns the slice's path.
inline Result<std::string> fetch_span_slice(const SliceFetch& a, const LayerSpan& sp) {
  const std::string url = base_url(a.gateway);
  std::string dir = a.dir;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = tmp != nullptr && *tmp != 0 ? tmp : "/var/tmp";
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string out = fmt::format("{}/span-{}-{}.gguf", dir, sp.first, sp.last);
  const std::string part = out + ".part";
  std::ofstream f(part, std::ios::binary | std::ios::trunc);
  if (!f) return make_error(StatusCode::kIoError, "cannot write {}", part);
  httplib::Client cli(url);
  cli.set_connection_timeout(10, 0);
  cli.set_read_timeout(300, 0);  // the gateway cuts the slice before the first byte
  httplib::Headers h;
  if (!a.admin_key.empty()) h.emplace("Authorization", "Bearer " + a.admin_key);
  uint64_t bytes = 0;
  int status = 0;
  std::string error_body;  // a refusal's JSON (bounded)
  auto res = cli.Get(
      fmt::format("/swarm/slice?layers={}-{}", sp.first, sp.last), h,
      [&](const httplib::Response& r) {
        status = r.status;
        return true;
      },
      [&](const char* data, size_t n) {
        if (status != 200) {
          error_body.append(data, std::min(n, size_t{65536} - std::min(error_body.size(), size_t{65536})));
          return true;
        }
        f.write(data, static_cast<std::streamsize>(n));
        bytes += n;
        return static_cast<bool>(f);
      });
  f.close();
  auto drop = [&](Status st) {
    std::filesystem::remove(part, ec);
    return st;
  };
  if (!res) {
    return drop(make_error(StatusCode::kUnavailable, "{}/swarm/slice: {}", url, httplib::to_string(res.error())));
  }
  if (res->status != 200) {
    return drop(make_error(StatusCode::kUnavailable, "{}/swarm/slice: HTTP {}: {}", url, res->status,
                           api_error_message(error_body)));
  }
  if (!f) return drop(make_error(StatusCode::kIoError, "cannot write {}", part));
  const std::string want = res->get_header_value("X-Moesh-Slice-Hash");
  auto got = swarm::file_hash_hex(part);
  if (!got) return drop(got.status());
  if (want.empty() || *got != want) {
    return drop(make_error(StatusCode::kCorrupt, "the slice from {} ({} bytes) hashes to {}, the gateway sent {}", url,
                           bytes, *got, want.empty() ? std::string("no hash") : want));
  }
  std::filesystem::rename(part, out, ec);
  if (ec) return drop(make_error(StatusCode::kIoError, "cannot rename {} to {}: {}", part, out, ec.message()));
  std::fprintf(stderr, "moesh %s: fetched %s (%.1f MiB, xxh3-128 %s) from %s\n", a.cmd, out.c_str(), bytes / 1048576.0,
               got->c_str(), url.c_str());
  return out;
}

// fetch_span_slice, then the slice loaded and checked: every tensor against its stored hash, and
// its model identity against `id` (the model the peer serves).
inline Result<std::unique_ptr<Model>> load_fetched_span(const SliceFetch& f, const LayerSpan& sp,
                                                        LoadOptions::Memory memory, const swarm::ModelIdentity& id) {
  MOESH_ASSIGN_OR_RETURN(std::string path, fetch_span_slice(f, sp));
  LoadOptions lo;
  lo.memory = memory;
  MOESH_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Model::load(path, lo));
  MOESH_RETURN_IF_ERROR(swarm::verify_slice_tensors(m->file()));
  MOESH_ASSIGN_OR_RETURN(swarm::ModelIdentity got, swarm::model_identity(m->file()));
  if (!(got == id)) {
    return make_error(StatusCode::kCorrupt, "the slice of blocks {}-{} is of model {}, this peer serves {}", sp.first,
                      sp.last, got.hex(), id.hex());
  }
  return m;
}

}  // namespace moesh::cli
