// `stensor report`: reads an access log (docs/access-log.md) once, line by
// line, and writes a self-contained HTML page (or, with `-o x.svg`, the
// picture alone): a summary of the swapping under the cap, the buffers that
// moved most, the kernels that waited longest for swaps, and device
// resident bytes over the run against the cap with the swap traffic beneath.
// docs/report.md describes what is shown and how to read it.
// The log is read in one pass, in bounded memory (tools/run_summary.h).
//
// Thread-safety: RunReport is reentrant (it writes only to the given streams
// and the output file).
#ifndef STENSOR_TOOLS_REPORT_H_
#define STENSOR_TOOLS_REPORT_H_

#include <ostream>
#include <string>
#include <vector>

#include "tools/run_summary.h"

namespace stensor {

// The page (summary, plot, the top `top` buffers and kernels) and the plot
// alone (an <svg> element, without an XML declaration), every string from
// the log escaped.
std::string ReportHtml(const RunSummary& summary, int top);
std::string ReportSvg(const RunSummary& summary);

// Runs the command on the arguments after `report`; 0 on success, 1 on a
// failure (an unreadable, foreign or truncated log, an unwritable output;
// told on `err` in one line naming the file and the line), 2 on bad
// arguments (with the usage).
int RunReport(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace stensor

#endif  // STENSOR_TOOLS_REPORT_H_
