#include "tools/report.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "tools/run_summary.h"

namespace stensor {
namespace {

constexpr char kUsage[] =
    "usage: stensor report LOG -o OUT.html|OUT.svg [--format html|svg] [--top N]\n"
    "                      [--granularity BYTES] [--partial]\n";

constexpr char kHelp[] =
    "\n"
    "Reads an access log (STENSOR_ACCESS_LOG, docs/access-log.md) and writes a\n"
    "self-contained report of the run: no scripts, no fonts or anything else\n"
    "fetched from the network. docs/report.md tells how to read it.\n"
    "\n"
    "  LOG                  the access log (JSON lines); - reads standard input\n"
    "                       (gzip -dc run.jsonl.gz | stensor report - -o r.html)\n"
    "  -o, --output PATH    where to write: a page (.html, .htm) with the summary,\n"
    "                       the tables and the plot, or the plot alone (.svg)\n"
    "  --format html|svg    the output's kind when PATH's extension says neither\n"
    "  --top N              rows of the buffer and kernel tables (default 10)\n"
    "  --granularity BYTES  the VMM granule that swappable allocations are\n"
    "                       charged in whole (default 2097152, as current GPUs)\n"
    "  --partial            report on a log that lacks its `end` record (the\n"
    "                       program did not exit normally) instead of failing\n"
    "  -h, --help           this text\n"
    "\n"
    "Shown: peak resident bytes per device against the cap (STENSOR_MEMORY_LIMIT\n"
    "from the log's header); swap-outs and swap-ins with a copy (bytes moved),\n"
    "clean and never-written drops and swap-ins without a copy (no bytes moved);\n"
    "the clean-drop share of evictions; the host's waits (swap_wait, evict_wait,\n"
    "unknown_wait); the buffers that moved most bytes; the kernels whose launch\n"
    "followed the longest swap waits; device resident bytes over the run\n"
    "(x: operation index) with the cap, and bytes out / in per bucket of\n"
    "operations beneath.\n"
    "\n"
    "Exit status: 0 written; 1 the log is unreadable, not an access log or\n"
    "truncated, or OUT cannot be written (one line names the file and line);\n"
    "2 bad arguments.\n";

enum class Format { kUnset, kHtml, kSvg };

struct ReportFlags {
  std::string log;
  std::string output;
  Format format = Format::kUnset;
  int top = 10;
  uint64_t granularity = uint64_t{2} << 20;
  bool partial = false;
  bool help = false;
};

absl::StatusOr<ReportFlags> ParseFlags(const std::vector<std::string>& args) {
  ReportFlags flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      flags.help = true;
      continue;
    }
    if (a == "--partial") {
      flags.partial = true;
      continue;
    }
    if (a.empty() || a[0] != '-' || a == "-") {
      if (!flags.log.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("one log only ('", flags.log, "' and '", a, "')"));
      }
      flags.log = a;
      continue;
    }
    std::string name = a, value;
    std::optional<std::string> inline_value;
    if (size_t eq = name.find('='); eq != std::string::npos && absl::StartsWith(name, "--")) {
      inline_value = name.substr(eq + 1);
      name.resize(eq);
    }
    if (name != "-o" && name != "--output" && name != "--format" && name != "--top" &&
        name != "--granularity") {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name));
    }
    if (inline_value) {
      value = *inline_value;
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(name, " needs a value"));
    }
    if (name == "-o" || name == "--output") {
      if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(name, " needs a path"));
      flags.output = value;
    } else if (name == "--format") {
      if (value == "html") {
        flags.format = Format::kHtml;
      } else if (value == "svg") {
        flags.format = Format::kSvg;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--format '", value, "' is not valid; expected html or svg"));
      }
    } else if (name == "--top") {
      if (!absl::SimpleAtoi(value, &flags.top) || flags.top < 1 || flags.top > 1000) {
        return absl::InvalidArgumentError(
            absl::StrCat("--top '", value, "' is not valid; expected 1 to 1000"));
      }
    } else {  // --granularity
      if (!absl::SimpleAtoi(value, &flags.granularity) || flags.granularity == 0 ||
          flags.granularity % 4096 != 0 || flags.granularity > (uint64_t{1} << 40)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--granularity '", value,
                         "' is not valid; expected a positive multiple of 4096 bytes"));
      }
    }
  }
  if (flags.help) return flags;
  if (flags.log.empty()) return absl::InvalidArgumentError("no access log given");
  if (flags.output.empty())
    return absl::InvalidArgumentError("-o OUT.html or -o OUT.svg is required");
  // Writing the page over the log would lose the log.
  struct stat log_stat, output_stat;
  if (flags.log != "-" &&
      (flags.output == flags.log ||
       (stat(flags.log.c_str(), &log_stat) == 0 && stat(flags.output.c_str(), &output_stat) == 0 &&
        log_stat.st_dev == output_stat.st_dev && log_stat.st_ino == output_stat.st_ino))) {
    return absl::InvalidArgumentError(
        absl::StrCat("-o '", flags.output, "' is the log itself; write the report elsewhere"));
  }
  if (flags.format == Format::kUnset) {
    std::string lower = flags.output;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (absl::EndsWith(lower, ".svg")) {
      flags.format = Format::kSvg;
    } else if (absl::EndsWith(lower, ".html") || absl::EndsWith(lower, ".htm")) {
      flags.format = Format::kHtml;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot tell the output's kind from '", flags.output,
                       "'; name it .html or .svg, or give --format html|svg"));
    }
  }
  return flags;
}

// Escapes text for HTML and XML alike (element content and attributes);
// control characters XML does not allow become U+FFFD.
std::string Escape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') {
          out += "\xEF\xBF\xBD";
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string Bytes(double bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f B", bytes) : absl::StrFormat("%.1f %s", bytes, kUnits[u]);
}

// A round step for about `target` ticks over [0, span].
double TickStep(double span, int target) {
  if (span <= 0) return 1;
  const double raw = span / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * mag) return m * mag;
  }
  return 10 * mag;
}

// A round byte step (powers of two of KiB/MiB/GiB times 1, 2, 5).
double ByteStep(double span, int target) {
  if (span <= 0) return 1;
  const double raw = span / target;
  double unit = 1;
  while (unit * 1024 <= raw) unit *= 1024;
  for (double m : {1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1024.0}) {
    if (raw <= m * unit) return m * unit;
  }
  return 1024 * unit;
}

std::string Num(double v) { return absl::StrFormat("%.1f", v); }

constexpr char kResidentColor[] = "#1f77b4";
constexpr char kCapColor[] = "#d62728";
constexpr char kOutColor[] = "#ff7f0e";
constexpr char kInColor[] = "#2ca02c";

// One panel per device: resident bytes (a step line, the maximum of each
// bucket) and the cap above, bytes out (up) and in (down) per bucket below.
std::string Svg(const RunSummary& r) {
  constexpr double kWidth = 1100, kLeft = 90, kRight = 30, kPlotH = 250, kBarsH = 120;
  constexpr double kPanelH = 50 + kPlotH + 28 + kBarsH + 36;
  const double plot_w = kWidth - kLeft - kRight;
  const ResidentTimeline& t = r.timeline;
  const size_t n = t.buckets();
  const double ops = std::max<double>(1, static_cast<double>(n) * t.width());
  const size_t panels = std::max<size_t>(1, r.devices.size());
  const double height = panels * kPanelH + 30;
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\" "
      "role=\"img\" aria-labelledby=\"plot-title\">\n"
      "<title id=\"plot-title\">Device resident bytes over the run of %s</title>\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n",
      kWidth, height, kWidth, height, Escape(r.log));
  if (r.devices.empty()) {
    absl::StrAppend(&s, "<text x=\"", kLeft,
                    "\" y=\"40\">No device allocations in the log.</text>\n");
  }
  for (size_t slot = 0; slot < r.devices.size(); ++slot) {
    const DeviceSummary& d = r.devices[slot];
    const double top = 30 + slot * kPanelH;
    const double plot_top = top + 50;
    const double base = plot_top + kPlotH;  // the resident plot's zero line
    const double bars_mid = base + 28 + kBarsH / 2;
    double ymax = std::max<double>(
        {1, static_cast<double>(d.peak), d.cap ? static_cast<double>(*d.cap) : 0.0});
    ymax *= 1.08;
    auto x_of = [&](double op) { return kLeft + op / ops * plot_w; };
    auto y_of = [&](double bytes) { return base - bytes / ymax * kPlotH; };
    absl::StrAppend(
        &s, "<g class=\"device\">\n",
        absl::StrFormat(
            "<text x=\"%s\" y=\"%s\" font-size=\"14\" font-weight=\"bold\">%s</text>\n", Num(kLeft),
            Num(top + 16),
            Escape(absl::StrCat(
                "Device ", d.ordinal, " (", d.name, "): resident bytes, peak ", Bytes(d.peak),
                d.cap ? absl::StrCat(", cap ", Bytes(*d.cap)) : std::string(", no cap")))));
    // Axes and grid.
    const double ystep = ByteStep(ymax, 5);
    for (double v = 0; v <= ymax; v += ystep) {
      absl::StrAppend(
          &s,
          absl::StrFormat("<line x1=\"%s\" x2=\"%s\" y1=\"%s\" y2=\"%s\" stroke=\"#e4e4e4\"/>"
                          "<text x=\"%s\" y=\"%s\" text-anchor=\"end\" fill=\"#444\">%s</text>\n",
                          Num(kLeft), Num(kLeft + plot_w), Num(y_of(v)), Num(y_of(v)),
                          Num(kLeft - 6), Num(y_of(v) + 4), Bytes(v)));
    }
    const double xstep = TickStep(ops, 8);
    for (double v = 0; v <= ops; v += xstep) {
      absl::StrAppend(
          &s, absl::StrFormat(
                  "<line x1=\"%s\" x2=\"%s\" y1=\"%s\" y2=\"%s\" stroke=\"#e4e4e4\"/>"
                  "<text x=\"%s\" y=\"%s\" text-anchor=\"middle\" fill=\"#444\">%.0f</text>\n",
                  Num(x_of(v)), Num(x_of(v)), Num(plot_top), Num(base), Num(x_of(v)),
                  Num(base + 16), v));
    }
    absl::StrAppend(
        &s,
        absl::StrFormat(
            "<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"none\" stroke=\"#888\"/>\n",
            Num(kLeft), Num(plot_top), Num(plot_w), Num(kPlotH)));
    // Resident bytes: an area and its outline, a step per bucket.
    std::string points;
    for (size_t b = 0; b < n; ++b) {
      const double y = y_of(static_cast<double>(t.Get(b, slot).max_resident));
      absl::StrAppend(&points, Num(x_of(static_cast<double>(b) * t.width())), ",", Num(y), " ",
                      Num(x_of(static_cast<double>(b + 1) * t.width())), ",", Num(y), " ");
    }
    if (!points.empty()) points.pop_back();
    absl::StrAppend(
        &s,
        absl::StrFormat("<polygon class=\"resident-area\" points=\"%s,%s %s %s,%s\" fill=\"%s\" "
                        "fill-opacity=\"0.15\" stroke=\"none\"/>\n",
                        Num(kLeft), Num(base), points, Num(x_of(ops)), Num(base), kResidentColor));
    absl::StrAppend(
        &s,
        absl::StrFormat("<polyline class=\"resident\" points=\"%s\" fill=\"none\" stroke=\"%s\" "
                        "stroke-width=\"2\" stroke-linejoin=\"round\"/>\n",
                        points, kResidentColor));
    if (d.cap) {
      absl::StrAppend(
          &s,
          absl::StrFormat(
              "<line class=\"cap\" x1=\"%s\" x2=\"%s\" y1=\"%s\" y2=\"%s\" stroke=\"%s\" "
              "stroke-width=\"2\" stroke-dasharray=\"8 4\"/>"
              "<text x=\"%s\" y=\"%s\" text-anchor=\"end\" fill=\"%s\">cap %s</text>\n",
              Num(kLeft), Num(kLeft + plot_w), Num(y_of(*d.cap)), Num(y_of(*d.cap)), kCapColor,
              Num(kLeft + plot_w - 4), Num(y_of(*d.cap) - 5), kCapColor, Escape(Bytes(*d.cap))));
    }
    // Traffic: out above the middle line, in below, on one scale.
    uint64_t tmax = 0;  // the scale: the largest bucket of either direction
    for (size_t b = 0; b < n; ++b) {
      const PlotPoint p = t.Get(b, slot);
      tmax = std::max({tmax, p.bytes_in, p.bytes_out});
    }
    const double half = kBarsH / 2 - 4;
    const double scale = static_cast<double>(std::max<uint64_t>(tmax, 1));
    std::string out_path, in_path;
    const double bw = std::max(plot_w / static_cast<double>(std::max<size_t>(n, 1)), 0.6);
    for (size_t b = 0; b < n; ++b) {
      const PlotPoint p = t.Get(b, slot);
      const double x = x_of(static_cast<double>(b) * t.width());
      if (p.bytes_out > 0) {
        const double h = std::max(1.0, p.bytes_out / scale * half);
        absl::StrAppend(&out_path, "M", Num(x), " ", Num(bars_mid - h), "h", Num(bw), "v", Num(h),
                        "h-", Num(bw), "z");
      }
      if (p.bytes_in > 0) {
        const double h = std::max(1.0, p.bytes_in / scale * half);
        absl::StrAppend(&in_path, "M", Num(x), " ", Num(bars_mid), "h", Num(bw), "v", Num(h), "h-",
                        Num(bw), "z");
      }
    }
    absl::StrAppend(
        &s,
        absl::StrFormat(
            "<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"none\" stroke=\"#888\"/>\n"
            "<line x1=\"%s\" x2=\"%s\" y1=\"%s\" y2=\"%s\" stroke=\"#888\"/>\n"
            "<path class=\"swap-out\" d=\"%s\" fill=\"%s\"/>\n"
            "<path class=\"swap-in\" d=\"%s\" fill=\"%s\"/>\n"
            "<text x=\"%s\" y=\"%s\" text-anchor=\"end\" fill=\"#444\">out %s</text>\n"
            "<text x=\"%s\" y=\"%s\" text-anchor=\"end\" fill=\"#444\">in %s</text>\n",
            Num(kLeft), Num(bars_mid - kBarsH / 2), Num(plot_w), Num(kBarsH), Num(kLeft),
            Num(kLeft + plot_w), Num(bars_mid), Num(bars_mid), out_path, kOutColor, in_path,
            kInColor, Num(kLeft - 6), Num(bars_mid - half + 8), Bytes(tmax), Num(kLeft - 6),
            Num(bars_mid + half), Bytes(tmax)));
    // Legend and axis label.
    absl::StrAppend(
        &s, absl::StrFormat(
                "<text x=\"%s\" y=\"%s\" text-anchor=\"middle\" fill=\"#444\">operation index "
                "(x axis; %u operation(s) per bucket)</text>\n",
                Num(kLeft + plot_w / 2), Num(bars_mid + kBarsH / 2 + 18), t.width()));
    const double ly = top + 36;
    double lx = kLeft;
    auto legend = [&](const char* color, const std::string& label, bool dashed) {
      absl::StrAppend(
          &s,
          absl::StrFormat(
              "<line x1=\"%s\" x2=\"%s\" y1=\"%s\" y2=\"%s\" stroke=\"%s\" stroke-width=\"%s\"%s/>"
              "<text x=\"%s\" y=\"%s\">%s</text>\n",
              Num(lx), Num(lx + 22), Num(ly - 4), Num(ly - 4), color, dashed ? "2" : "8",
              dashed ? " stroke-dasharray=\"8 4\"" : "", Num(lx + 28), Num(ly), Escape(label)));
      lx += 44 + 6.5 * label.size();
    };
    legend(kResidentColor, "resident bytes (max per bucket)", false);
    if (d.cap) legend(kCapColor, "cap", true);
    legend(kOutColor, "swap-out bytes, device to host (up)", false);
    legend(kInColor, "swap-in bytes copied, host to device (down)", false);
    absl::StrAppend(&s, "</g>\n");
  }
  absl::StrAppend(&s, "</svg>\n");
  return s;
}

std::string Share(double part, double whole) {
  return whole > 0 ? absl::StrFormat("%.1f%%", 100.0 * part / whole) : "-";
}

std::string Row(absl::string_view label, absl::string_view value, absl::string_view note = "") {
  return absl::StrCat("<tr><th>", Escape(label), "</th><td>", Escape(value), "</td><td>",
                      Escape(note), "</td></tr>\n");
}

std::string CountRow(absl::string_view label, const RecordCount& c, absl::string_view note) {
  return Row(label, absl::StrCat(c.records, " (", Bytes(c.bytes), ", ", c.bytes, " bytes)"), note);
}

std::string Html(const RunSummary& r, const std::vector<const KernelSummary*>& kernels, int top) {
  std::string h =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  absl::StrAppend(&h, "<title>stensor report: ", Escape(r.log), "</title>\n");
  absl::StrAppend(
      &h,
      "<style>\n"
      "body{font-family:sans-serif;margin:24px auto;max-width:1140px;color:#222;"
      "background:#fff;line-height:1.4}\n"
      "h1{font-size:22px;margin-bottom:4px}h2{font-size:18px;margin-top:28px;"
      "border-bottom:1px solid #ddd;padding-bottom:4px}\n"
      "table{border-collapse:collapse;margin:8px 0}\n"
      "th,td{padding:3px 10px;text-align:left;vertical-align:top;border-bottom:1px solid #eee}\n"
      "td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}\n"
      "table.summary th{font-weight:normal;color:#444;white-space:nowrap}\n"
      "table.summary td:nth-child(3){color:#666;font-size:13px}\n"
      "code,.kernel{font-family:monospace;font-size:13px;overflow-wrap:anywhere}\n"
      ".note{color:#666;font-size:13px}.warn{color:#a33}.headline{font-size:16px}\n"
      "svg{max-width:100%;height:auto}\n"
      "</style>\n</head>\n<body>\n");
  absl::StrAppend(&h, "<h1>stensor report</h1>\n<p class=\"note\">", Escape(r.log), ": ", r.lines,
                  " lines, ", r.operations, " operations (", r.launches, " launches), pid ", r.pid,
                  ". Policy ", Escape(r.policy.empty() ? "(unset)" : r.policy), ", prefetch ",
                  Escape(r.prefetch.empty() ? "(unset)" : r.prefetch), ".</p>\n");
  if (!r.ended) {
    absl::StrAppend(&h,
                    "<p class=\"warn\">The log has no <code>end</code> record: it was "
                    "truncated (--partial); figures cover the lines read.</p>\n");
  }

  // The headline, then the plot.
  std::string peaks;
  for (const DeviceSummary& d : r.devices) {
    absl::StrAppend(&peaks, peaks.empty() ? "Device " : "; device ", d.ordinal, " peaked at ",
                    Bytes(d.peak),
                    d.cap ? absl::StrCat(" under a cap of ", Bytes(*d.cap)) : " with no cap");
  }
  double waited = 0;
  for (const auto& [what, w] : r.swap_waits) waited += w.second;
  absl::StrAppend(
      &h, "<p class=\"headline\">", Escape(peaks.empty() ? "No device memory allocated" : peaks),
      ". Moved ", Escape(Bytes(r.swap_out.bytes + r.swap_in_copy.bytes)), " (",
      Escape(Bytes(r.swap_out.bytes)), " out, ", Escape(Bytes(r.swap_in_copy.bytes)), " in); ",
      r.drop_clean.records + r.drop_unwritten.records,
      " evictions needed no copy; the host waited ", absl::StrFormat("%.3f s", waited),
      " for swaps",
      r.served_from_host.records + r.born_on_host.records == 0
          ? ""
          : absl::StrCat("; ", r.buffers_served, " buffers served from host memory (",
                         Escape(Bytes(r.served_from_host.bytes)), " reached over the link)"),
      ".</p>\n");
  // The plot.
  absl::StrAppend(&h,
                  "<h2>Resident bytes and swap traffic</h2>\n<p class=\"note\">Device memory "
                  "held by the program's buffers (as the manager charges them: whole granules, "
                  "or pages) after each operation, the highest of each bucket of ",
                  r.timeline.width(),
                  " operation(s); the dashed line is the cap. Beneath: bytes copied out (up) and "
                  "in (down) in each bucket. Drops and swap-ins without a copy move no bytes and "
                  "show only in the line.</p>\n");
  absl::StrAppend(&h, Svg(r));

  // Summary.
  absl::StrAppend(&h, "<h2>Summary</h2>\n<table class=\"summary\">\n");
  absl::StrAppend(
      &h, Row("STENSOR_MEMORY_LIMIT", r.limit_text.empty() ? "(unset: no cap)" : r.limit_text));
  for (const DeviceSummary& d : r.devices) {
    absl::StrAppend(
        &h, Row(absl::StrCat("device ", d.ordinal, " peak resident"),
                absl::StrCat(Bytes(d.peak), " (", d.peak, " bytes) at operation ", d.peak_op),
                d.cap ? absl::StrCat(Share(d.peak, *d.cap), " of the cap") : "no cap"));
    absl::StrAppend(
        &h,
        Row(absl::StrCat("device ", d.ordinal, " cap"),
            d.cap ? absl::StrCat(Bytes(*d.cap), " (", *d.cap, " bytes)") : "none",
            absl::StrCat(d.name,
                         d.total_bytes ? absl::StrCat(", ", Bytes(d.total_bytes), " total") : "")));
  }
  const RecordCount& out = r.swap_out;
  const RecordCount& in = r.swap_in_copy;
  absl::StrAppend(&h, CountRow("swap_out", out, "device to host copies (bytes moved)"));
  absl::StrAppend(&h, CountRow("swap_in with copy", in, "host to device copies (bytes moved)"));
  absl::StrAppend(
      &h, Row("bytes moved",
              absl::StrCat(Bytes(out.bytes + in.bytes), " (", out.bytes + in.bytes, " bytes)"),
              "swap_out plus swap_in with copy"));
  absl::StrAppend(&h, CountRow("drop_clean", r.drop_clean, "host copy current: no copy"));
  absl::StrAppend(&h, CountRow("drop_unwritten", r.drop_unwritten, "never written: no copy"));
  absl::StrAppend(&h, CountRow("swap_in without copy", r.swap_in_no_copy,
                               "overwritten whole or never written: no copy"));
  const uint64_t evictions = out.records + r.drop_clean.records + r.drop_unwritten.records;
  absl::StrAppend(&h, Row("clean-drop share of evictions", Share(r.drop_clean.records, evictions),
                          absl::StrCat("drop_clean of ", evictions,
                                       " evictions (swap_out + drop_clean + drop_unwritten)")));
  absl::StrAppend(&h, Row("evictions without a copy",
                          Share(r.drop_clean.records + r.drop_unwritten.records, evictions),
                          "drop_clean and drop_unwritten"));
  double swap_wait = 0;
  uint64_t swap_waits = 0;
  std::string by_what;
  for (const auto& [what, w] : r.swap_waits) {
    swap_wait += w.second;
    swap_waits += w.first;
    absl::StrAppend(&by_what, by_what.empty() ? "what: " : "; ", what.empty() ? "?" : what, " ",
                    w.first, absl::StrFormat(" (%.3f s)", w.second));
  }
  absl::StrAppend(
      &h,
      Row("time waited for swaps", absl::StrFormat("%.3f s in %u swap_wait", swap_wait, swap_waits),
          by_what.empty() ? "the host never waited for stensor's streams" : by_what));
  absl::StrAppend(
      &h, Row("time waited to evict",
              absl::StrFormat("%.3f s in %u evict_wait", r.evict_waits.second, r.evict_waits.first),
              "for the program's work on buffers about to be evicted"));
  if (r.unknown_waits.first > 0) {
    absl::StrAppend(&h, Row("time waited for unknown work",
                            absl::StrFormat("%.3f s in %u unknown_wait", r.unknown_waits.second,
                                            r.unknown_waits.first)));
  }
  if (r.ooms.records > 0)
    absl::StrAppend(&h, CountRow("oom", r.ooms, "allocations refused: nothing left to evict"));
  if (r.pins.records > 0)
    absl::StrAppend(&h, CountRow("pin", r.pins, "buffers made resident for good"));
  if (r.served_from_host.records > 0) {
    absl::StrAppend(&h, CountRow("serve_host", r.served_from_host,
                                 "operations that reached a buffer in host memory, over the "
                                 "link (bytes per operation)"));
    absl::StrAppend(&h, Row("buffers served from host", absl::StrCat(r.buffers_served),
                            "distinct buffers among the serve_host records"));
    absl::StrAppend(&h, Row("served by choice", absl::StrCat(r.served_by_choice),
                            "serve_host records where room could have been made: brought in, "
                            "the buffer would have displaced one needed no later, or been "
                            "forced out again before its next use"));
  }
  if (r.born_on_host.records > 0) {
    absl::StrAppend(&h, CountRow("alloc_host", r.born_on_host,
                                 "buffers born in host memory: no room on the device"));
  }
  if (r.verify_mismatches.records > 0) {
    absl::StrAppend(
        &h, CountRow("verify_mismatch", r.verify_mismatches, "clean drops that were not clean"));
  }
  if (r.table_read_backs.records > 0) {
    absl::StrAppend(&h,
                    CountRow("table_read_back", r.table_read_backs, "pointer tables read back"));
  }
  if (r.live_at_end) absl::StrAppend(&h, Row("live buffers at exit", absl::StrCat(*r.live_at_end)));
  if (r.dropped > 0) {
    absl::StrAppend(&h, Row("records lost", absl::StrCat(r.dropped),
                            "the log is incomplete: figures are lower bounds"));
  }
  if (r.inconsistent > 0) {
    absl::StrAppend(
        &h,
        Row("records out of order", absl::StrCat(r.inconsistent),
            "swap records that did not match the buffer's state: resident bytes are approximate"));
  }
  absl::StrAppend(&h, "</table>\n");

  // Buffers.
  absl::StrAppend(&h, "<h2>Buffers that moved most</h2>\n");
  if (r.top_buffers.empty()) {
    absl::StrAppend(&h, "<p>No buffer was copied in or out.</p>\n");
  } else {
    absl::StrAppend(
        &h,
        "<table class=\"buffers\">\n<tr><th class=\"n\">buffer</th><th class=\"n\">size</th>"
        "<th class=\"n\">moved</th><th class=\"n\">swap-outs</th><th class=\"n\">out</th>"
        "<th class=\"n\">swap-ins</th><th class=\"n\">in (copied)</th>"
        "<th class=\"n\">drops</th><th>first used by</th></tr>\n");
    for (const BufferSummary& b : r.top_buffers) {
      absl::StrAppend(&h, "<tr><td class=\"n\">", b.id, "</td><td class=\"n\">",
                      Escape(Bytes(b.bytes)), "</td><td class=\"n\">", Escape(Bytes(b.moved())),
                      "</td><td class=\"n\">", b.swap_outs, "</td><td class=\"n\">",
                      Escape(Bytes(b.bytes_out)), "</td><td class=\"n\">", b.swap_ins,
                      "</td><td class=\"n\">", Escape(Bytes(b.bytes_in)), "</td><td class=\"n\">",
                      b.drops, "</td><td class=\"kernel\">",
                      b.first_kernel >= 0 ? Escape(r.kernels[b.first_kernel].name) : "(no launch)",
                      "</td></tr>\n");
    }
    absl::StrAppend(&h, "</table>\n");
  }
  absl::StrAppend(&h, "<p class=\"note\">Top ", top,
                  " by bytes moved (swap-outs plus swap-ins with a copy). Drops and swap-ins "
                  "without a copy are counted but move nothing.</p>\n");

  // Kernels.
  absl::StrAppend(&h, "<h2>Kernels that waited longest</h2>\n");
  if (kernels.empty()) {
    absl::StrAppend(&h, "<p>No swap_wait record: the host never waited for a swap.</p>\n");
  } else {
    absl::StrAppend(&h,
                    "<table class=\"kernels\">\n<tr><th>kernel</th><th class=\"n\">waited</th>"
                    "<th class=\"n\">waits</th><th class=\"n\">launches</th></tr>\n");
    for (const KernelSummary* k : kernels) {
      absl::StrAppend(&h, "<tr><td class=\"kernel\">", Escape(k->name), "</td><td class=\"n\">",
                      absl::StrFormat("%.3f s", k->wait_seconds), "</td><td class=\"n\">", k->waits,
                      "</td><td class=\"n\">", k->launches, "</td></tr>\n");
    }
    absl::StrAppend(&h, "</table>\n");
  }
  absl::StrAppend(&h,
                  "<p class=\"note\">Each swap_wait (the host waiting for stensor's swap "
                  "streams) is charged to the next kernel launched after it: the launch it "
                  "held up.</p>\n</body>\n</html>\n");
  return h;
}

}  // namespace

std::string ReportSvg(const RunSummary& summary) { return Svg(summary); }

std::string ReportHtml(const RunSummary& summary, int top) {
  std::vector<const KernelSummary*> kernels;
  for (const KernelSummary& k : summary.kernels) {
    if (k.waits > 0) kernels.push_back(&k);
  }
  std::sort(kernels.begin(), kernels.end(), [](const KernelSummary* a, const KernelSummary* b) {
    return a->wait_seconds != b->wait_seconds ? a->wait_seconds > b->wait_seconds
                                              : a->name < b->name;
  });
  if (kernels.size() > static_cast<size_t>(top)) kernels.resize(top);
  return Html(summary, kernels, top);
}

int RunReport(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  absl::StatusOr<ReportFlags> flags = ParseFlags(args);
  if (!flags.ok()) {
    err << "stensor report: " << flags.status().message() << "\n" << kUsage;
    return 2;
  }
  if (flags->help) {
    out << kUsage << kHelp;
    return 0;
  }
  SummaryOptions options;
  options.granularity = flags->granularity;
  options.top = flags->top;
  options.partial = flags->partial;
  absl::StatusOr<RunSummary> report = flags->log == "-"
                                          ? SummarizeLog(std::cin, "(standard input)", options)
                                          : SummarizeLog(flags->log, options);
  if (!report.ok()) {
    err << "stensor report: " << report.status().message() << "\n";
    return 1;
  }
  const std::string document =
      flags->format == Format::kSvg
          ? absl::StrCat("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", ReportSvg(*report))
          : ReportHtml(*report, flags->top);
  std::ofstream file(flags->output, std::ios::binary | std::ios::trunc);
  if (file) file << document;
  if (file) file.close();
  if (!file) {
    err << "stensor report: cannot write " << flags->output << ": " << std::strerror(errno) << "\n";
    return 1;
  }
  return 0;
}

}  // namespace stensor
