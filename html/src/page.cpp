// The frame of isorun's pages (see page.hpp).
#include "isorun/html/page.hpp"

#include "isorun/html/svg.hpp"

namespace isorun::html {

namespace {

// What every page looks like: a report's cards, tables and charts, a timeline's charts.
const char* style = R"(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:14px;margin:14px 0 4px;color:#444}
.sub{color:#666}.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:110px}.card b{display:block;font-size:18px}
.charts{display:flex;flex-wrap:wrap;gap:8px}figure{margin:0}figcaption{font-size:12px;color:#555;text-align:center}
svg text{font-size:10px;fill:#444}svg .label{font-size:11px;fill:#222}
.axis line{stroke:#888}.grid{stroke:#eee!important}circle{fill:#264653;fill-opacity:.55}
.box rect{fill:#a8dadc;stroke:#1d3557}.box line{stroke:#1d3557}.box .median{stroke-width:2}
.parallel polyline{fill:none;stroke-opacity:.55;stroke-width:1.2}.parallel polyline:hover{stroke-width:3;stroke-opacity:1}
.gantt rect:hover,.peaks g:hover rect{stroke:#000}.busy{fill:#8ab17d}
.reserved{fill:#bcd4e6;stroke:#457b9d}.allocated{fill:#457b9d;stroke:#1d3557}
polyline.reserved{fill:none;stroke:#7fa7c9;stroke-width:1.5}polyline.allocated{fill:none;stroke:#1d3557;stroke-width:1.5}
line.cap{stroke:#c1121f;stroke-dasharray:6 3;stroke-width:1.5}text.cap{fill:#c1121f}line.oom{stroke:#9b2226;stroke-width:2}
.legend{font-size:12px;color:#555}.swatch{display:inline-block;width:12px;height:10px;margin:0 4px 0 10px;vertical-align:middle}
.swatch.reserved{background:#bcd4e6}.swatch.allocated{background:#457b9d}.swatch.cap{background:#c1121f;height:2px}
table{border-collapse:collapse;font-size:12px}th,td{border-bottom:1px solid #eee;padding:3px 8px;text-align:left;white-space:nowrap}
th{cursor:pointer;background:#f6f6f6;position:sticky;top:0}th.sorted-asc:after{content:" ▲"}th.sorted-desc:after{content:" ▼"}
td.num{text-align:right;font-variant-numeric:tabular-nums}td.err{white-space:normal;max-width:360px;color:#9b2226}
.outcome{display:inline-block;width:9px;height:9px;border-radius:2px;margin-right:5px}
.tablewrap{overflow-x:auto;max-height:620px;overflow-y:auto;border:1px solid #ddd}
.pager{margin:6px 0}.pager button{margin-right:6px}.oom{background:#fff5f5;border:1px solid #f1c0c0;padding:6px 10px;margin:6px 0}
.bar{display:inline-block;height:8px;background:#9b2226;vertical-align:middle}
.curves polyline{fill:none;stroke-width:1.2}.curves .full{stroke:#264653;stroke-opacity:.8}
.curves .pruned{stroke:#adb5bd;stroke-opacity:.35}.curves circle.stop{fill:#9d8189;fill-opacity:.5}.curves polyline:hover{stroke-width:3;stroke-opacity:1}
line.rung{stroke:#e76f51;stroke-dasharray:4 3}
#live{position:fixed;top:8px;right:12px;font-size:12px;background:#f6f6f6;border:1px solid #ddd;border-radius:4px;padding:2px 8px;color:#555}
)";

// A live page's news (report_server.cpp): a long poll for the page after the generation this one
// shows, held by the server while a sweep runs; a new page is swapped in for the body (no reload:
// the reader's scroll and the table's sort stay), and a badge says what the server said.
const char* live_script = R"(
(function(){
  var root = document.documentElement, gen = root.getAttribute('data-generation'), updates = 0;
  var badge = document.createElement('div');
  badge.id = 'live';
  function say(text){ badge.textContent = text; if (badge.parentNode !== document.body) document.body.appendChild(badge); }
  function swap(html, next){
    var doc = new DOMParser().parseFromString(html, 'text/html'), y = window.scrollY;
    document.title = doc.title;
    document.body.replaceWith(document.adoptNode(doc.body));
    // A script parsed elsewhere never runs: the table's runs again as a new element.
    var old = document.getElementById('table-script');
    if (old) { var s = document.createElement('script'); s.id = old.id; s.textContent = old.textContent; old.replaceWith(s); }
    window.scrollTo(0, y);
    gen = next;
    root.setAttribute('data-generation', gen);
    root.setAttribute('data-live-updates', String(++updates));
  }
  function poll(){
    fetch('live?since=' + encodeURIComponent(gen), {cache: 'no-store'}).then(function(r){
      var running = r.headers.get('X-Isorun-Running') === '1', last = r.headers.get('X-Isorun-Closing') === '1';
      if (r.status !== 200 && r.status !== 204) {
        say('the server refused (HTTP ' + r.status + '): open the address isorun printed');
        return;
      }
      return (r.status === 200 ? r.text() : Promise.resolve(null)).then(function(html){
        if (html !== null) swap(html, r.headers.get('X-Isorun-Generation'));
        if (last) return say('the server has stopped: this page no longer updates');
        say(running ? 'live: the sweep is running' : 'live: no sweep runs in this folder now');
        setTimeout(poll, running ? 1000 : 5000);
      });
    }).catch(function(){ say('the server does not answer: trying again'); setTimeout(poll, 5000); });
  }
  poll();
})();
)";

}  // namespace

void page_head(std::ostringstream& o, const std::string& title, const std::string& live_generation) {
  o << "<!DOCTYPE html><html lang=\"en\"";
  if (!live_generation.empty()) o << " data-generation=\"" << svg::esc(live_generation) << "\"";
  o << "><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>"
    << svg::esc(title) << "</title><style>" << style << "</style></head><body>";
}

void page_tail(std::ostringstream& o, const std::string& live_generation) {
  if (!live_generation.empty()) o << "<script>" << live_script << "</script>";
  o << "</body></html>\n";
}

}  // namespace isorun::html
