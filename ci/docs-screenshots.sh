#!/usr/bin/env bash
# Build the docs site and look at it in a real headless browser, opened from disk (file://).
#
#   ci/docs-screenshots.sh [OUT_DIR] [PAGE[#anchor] ...]
#
# Builds with `mkdocs build --strict` into OUT_DIR/site (default OUT_DIR: a new temp folder),
# then for each page:
#   - saves a 1280 px wide screenshot, OUT_DIR/<page>.png (scrolled to #anchor when given), to look at;
#   - checks that no table on the page is wider than the content column at 1280 px, so no column
#     is cut off, and that no word in a table cell is broken across two lines ("tes t"; a line may
#     end at a space, a hyphen or a slash, and long code also after "_", "." or ",": docs/js)
#     (a copy of the page with a small measuring script, read back with --dump-dom).
# Also checks every page of the site for overflowing tables. Exits non-zero on any overflow.
# Installs Debian's chromium when no chromium is found (needs root and the network).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d)}
shift || true
pages=("$@")
[ ${#pages[@]} -gt 0 ] || pages=(
  "porting.html#deliberate-differences"
  "writing-a-driver.html#what-to-declare"
  "benchmarks.html#the-machines"
  "index.html"
)
mkdir -p "$out"
out=$(cd "$out" && pwd)

browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
  echo "no chromium found: installing Debian's chromium" >&2
  apt-get update && apt-get install -y chromium
  browser=$(command -v chromium)
fi

PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" python3 -m mkdocs build --strict --site-dir "$out/site"

chrome() {
  local profile
  profile=$(mktemp -d)
  timeout 60 "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$profile" --window-size=1280,2000 "$@" 2>/dev/null
  rm -rf "$profile"
}

# The measuring script: every table's right edge against the content column's, after the theme's JS.
probe='<script>window.addEventListener("load",function(){var c=document.querySelector(".wy-nav-content")||document.body;
var edge=c.getBoundingClientRect().right,bad=[];document.querySelectorAll(".rst-content table").forEach(function(t,i){
var r=t.getBoundingClientRect();if(r.right>edge+1||t.scrollWidth>t.clientWidth+1){bad.push("table "+(i+1)+" ("+Math.round(r.right)+" px > "+Math.round(edge)+" px)")}});
var broken=[];document.querySelectorAll(".rst-content table td, .rst-content table th").forEach(function(cell){
var w=document.createTreeWalker(cell,NodeFilter.SHOW_TEXT),n,m,re=/[^\s\/_.,-]+/g;while((n=w.nextNode())){re.lastIndex=0;
while((m=re.exec(n.data))){var g=document.createRange();g.setStart(n,m.index);g.setEnd(n,m.index+m[0].length);
var tops={};Array.prototype.forEach.call(g.getClientRects(),function(q){if(q.width>0){tops[Math.round(q.top)]=1}});
if(Object.keys(tops).length>1){broken.push(m[0])}}}});
if(broken.length){bad.push("words broken across lines: "+broken.slice(0,8).join(" "))}
var p=document.createElement("pre");p.id="tablecheck";p.textContent=bad.length?"OVERFLOW "+bad.join(", "):"OK";document.body.appendChild(p)});</script>'

# Opened with an #anchor, the screenshot starts at that heading: what stands before it is hidden.
scroll='<script>window.addEventListener("load",function(){var h=document.getElementById(location.hash.slice(1));
if(!h){return}var e=h.previousElementSibling;while(e){e.style.display="none";e=e.previousElementSibling}});</script>'

inject() {  # inject SCRIPT PAGE COPY: a copy of PAGE (next to it, so its links work) with SCRIPT added
  SCRIPT=$1 python3 -c 'import os, sys
text = open(sys.argv[1], encoding="utf-8").read()
open(sys.argv[2], "w", encoding="utf-8").write(text.replace("</body>", os.environ["SCRIPT"] + "</body>"))' "$2" "$3"
}

status=0
check() {  # check PAGE: 0 when no table overflows at 1280 px
  local page=$1 copy="$out/site/.check-$1" line
  inject "$probe" "$out/site/$page" "$copy"
  line=$(chrome --virtual-time-budget=3000 --dump-dom "file://$copy" | grep -o '<pre id="tablecheck">[^<]*' || echo "> no result")
  rm -f "$copy"
  line=${line#*>}
  echo "$page: $line"
  [ "$line" = OK ]
}

for entry in "${pages[@]}"; do
  page=${entry%%#*}
  anchor=${entry#"$page"}
  shot="$out/${page%.html}.png"
  copy="$out/site/.shot-$page"
  inject "$scroll" "$out/site/$page" "$copy"
  chrome --virtual-time-budget=3000 --screenshot="$shot" "file://$copy$anchor" >/dev/null
  rm -f "$copy"
  [ -s "$shot" ] && echo "screenshot: $shot ($entry)" || { echo "no screenshot of $entry" >&2; status=1; }
done
for html in "$out"/site/*.html; do
  name=$(basename "$html")
  [ "$name" = 404.html ] || [ "$name" = search.html ] && continue
  check "$name" || status=1
done
exit $status
