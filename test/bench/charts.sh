#!/usr/bin/env bash
# The benchmarks' charts (SVG, drawn with gnuplot), made from the results files the
# benchmark scripts write, never from numbers typed by hand. test/bench/run.sh and
# test/bench/peers/run.sh call it at their end; run alone, it redraws every chart from
# the committed results in a few seconds:
#
#   test/bench/charts.sh
#
#   test/bench/tps.svg, tps-pgNN.svg   TPS of each scenario (results.md, results-pgNN.md)
#   test/bench/targets.svg             each single-node target of docs/performance.md:
#                                      the measured ratio against its floor, per
#                                      PostgreSQL version, and the target's line
#   test/bench/peers/peers.svg         requests/s and server CPU per request of the
#                                      extension and each peer (peers/results-pgNN.md),
#                                      synchronous_commit off, per PostgreSQL version
#
# results.md is PostgreSQL 15's; results-pgNN.md another version's. It installs gnuplot
# (Debian's gnuplot-nox) when missing and it runs as root; otherwise it needs gnuplot.
set -euo pipefail
cd "$(dirname "$0")/../.."
bench=test/bench
if ! command -v gnuplot >/dev/null; then
  . scripts/lib.sh
  ensure_packages gnuplot-nox
fi
work=$(mktemp -d /tmp/idempotency-charts.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The version a results file is of: results.md is 15's, results-pgNN.md NN's.
version_of() {
  case $1 in
    */results.md) echo 15 ;;
    *) sed -E 's/.*results-pg([0-9]+)\.md$/\1/' <<<"$1" ;;
  esac
}
# The results files of one folder, PostgreSQL 15's first, then by version.
results_files() {
  local file
  for file in "$1"/results.md "$1"/results-pg[0-9]*.md; do
    if [ -f "$file" ]; then echo "$(version_of "$file") $file"; fi
  done | sort -n -u -k1,1
}

# The style shared by every chart.
common='set terminal svg size WIDTH,HEIGHT font "DejaVu Sans,11" noenhanced background rgb "white"
set style fill solid 1.0 border rgb "#404040"
set border 3 lw 0.8
set tics nomirror
set grid ytics lc rgb "#d8d8d8" dt 1
set key top right samplen 1.2 spacing 1.1'
# Two shades per version: the first version solid, the next lighter, and so on.
version_shade() {  # INDEX #RRGGBB -> the colour (an integer) for the INDEXth version
  local c=$2 f=$(( $1 * 45 ))
  [ "$f" -le 80 ] || f=80
  local r=$((16#${c:1:2})) g=$((16#${c:3:2})) b=$((16#${c:5:2}))
  echo $(( (r + (255 - r) * f / 100) * 65536 + (g + (255 - g) * f / 100) * 256 + b + (255 - b) * f / 100 ))
}

# ---------------------------------------------------------------------------------
# TPS by scenario, one chart per version
# ---------------------------------------------------------------------------------
tps_chart() {  # VERSION RESULTS
  local version=$1 file=$2 suffix="" measured
  [ "$version" = 15 ] || suffix=-pg$version
  awk -F'|' '$3 ~ /^ (off|on) $/ && $4 ~ /\(/ {
      v = $4; sub(/^ +/, "", v); sub(/ .*/, "", v)
      gsub(/ /, "", $2); gsub(/ /, "", $3); print $3, $2, v }' "$file" >"$work/tps.dat"
  [ -s "$work/tps.dat" ] || { echo "charts.sh: no TPS table in $file" >&2; return 1; }
  awk '$1 == "off" { print $2, $3 }' "$work/tps.dat" >"$work/off.dat"
  awk '$1 == "on" { print $2, $3 }' "$work/tps.dat" >"$work/on.dat"
  measured=$(sed -nE 's/^Measured ([0-9-]+) on .*PostgreSQL ([0-9.]+), ([0-9]+) clients, ([0-9]+) interleaved rounds.*/\1, PostgreSQL \2, \3 clients, medians of \4 rounds/p' "$file")
  gnuplot <<GNUPLOT
${common//WIDTH,HEIGHT/820,420}
set output "$bench/tps$suffix.svg"
set title "TPS by scenario ($measured)"
set style data histograms
set style histogram clustered gap 1
set ylabel "transactions per second"
set yrange [0:$(awk '$3 > m { m = $3 } END { print m * 1.15 }' "$work/tps.dat")]
set xtics rotate by -30 left scale 0
set key top center horizontal
set bmargin 5
plot "$work/off.dat" using 2:xtic(1) title "synchronous_commit = off" lc rgb "#4c72b0", \
     "$work/on.dat" using 2 title "synchronous_commit = on" lc rgb "#dd8452"
GNUPLOT
  echo "drew $bench/tps$suffix.svg from $file"
}

# ---------------------------------------------------------------------------------
# The single-node targets: each ratio against its floor, per version
# ---------------------------------------------------------------------------------
# Each target of docs/performance.md's Targets tables that is a ratio: what is measured
# (from a results file), the line it must reach, and its label. Ratios of throughput
# medians, but for one taken from one session's CPU time per transaction.
targets_of() {  # RESULTS -> "index<TAB>ratio<TAB>target<TAB>label" lines
  awk -F'|' '
    function num(s) { gsub(/[^0-9.]/, "", s); return s + 0 }
    $3 ~ /^ (off|on) $/ && $4 ~ /\(/ {
      s = $2; gsub(/ /, "", s); sync = $3; gsub(/ /, "", sync)
      v = $4; sub(/^ +/, "", v); sub(/ .*/, "", v); tps[sync, s] = v + 0 }
    /idem_once at [0-9.]+×/ { match($0, /idem_once at [0-9.]+×/); once = num(substr($0, RSTART + 13, RLENGTH - 13)) }
    $2 ~ /the same while ext_new runs/ { match($3, /\([0-9.]+×\)/); reaping = num(substr($3, RSTART, RLENGTH)) }
    $2 ~ /one session.s CPU per transaction/ {
      names = $2; sub(/.*\): */, "", names); n = split(names, name, " / ")
      split($3, value, " / ")
      for (i = 1; i <= n; i++) { gsub(/ /, "", name[i]); cpu[name[i]] = num(value[i]) } }
    function out(label, ratio, target) {
      if (ratio > 0) printf "%d\t%.3f\t%.3f\t%s\n", ++k, ratio, target, label; else ++k }
    function r(a, b) { return (a > 0 && b > 0) ? a / b : 0 }
    END {
      out("ext_new / floor_ttl\\nasync commit\\n≥ 1.0", r(tps["off", "ext_new"], tps["off", "floor_ttl"]), 1.0)
      out("ext_new / floor_ttl\\nsync commit\\n≥ 1.0", r(tps["on", "ext_new"], tps["on", "floor_ttl"]), 1.0)
      out("ext_new / floor_ttl\\nCPU per call\\n≥ 1.0", r(cpu["floor_ttl"], cpu["ext_new"]), 1.0)
      out("ext_new / floor\\nasync commit\\n≥ 1.0", r(tps["off", "ext_new"], tps["off", "floor"]), 1.0)
      out("ext_new / floor\\nsync commit\\n≥ 1.0", r(tps["on", "ext_new"], tps["on", "floor"]), 1.0)
      out("idem_once\\n/ its floor\\n≥ 0.8", once, 0.8)
      out("ext_emit /\\next_plain_emit\\nasync ≥ 0.9", r(tps["off", "ext_emit"], tps["off", "ext_plain_emit"]), 0.9)
      out("ext_emit /\\next_plain_emit\\nsync ≥ 0.9", r(tps["on", "ext_emit"], tps["on", "ext_plain_emit"]), 0.9)
      out("ext_emit / ext_new\\n(emit adds ≤ 10 %%)\\n≥ 0.91", r(tps["off", "ext_emit"], tps["off", "ext_new"]), 1 / 1.1)
      out("ext_replay / bare\\nasync commit\\n≥ 1.1", r(tps["off", "ext_replay"], tps["off", "bare"]), 1.1)
      out("ext_new while\\nthe worker reaps\\n≥ 0.9", reaping, 0.9)
    }' "$1"
}

targets_chart() {
  local files version file index=0 count ticks="" plot="" rgb
  files=$(results_files "$bench")
  [ -n "$files" ] || { echo "charts.sh: no results in $bench: no targets chart" >&2; return 0; }
  count=$(wc -l <<<"$files")
  : >"$work/targets.dat"
  : >"$work/lines.dat"
  while read -r version file; do
    rgb=$(version_shade "$index" "#4c72b0")
    # x: the target's place, each version's bar beside the others
    targets_of "$file" | awk -F'\t' -v v="$index" -v n="$count" -v rgb="$rgb" '
      { w = 0.8 / n; x = $1 - 0.4 + w * (v + 0.5)
        printf "%.3f\t%s\t%d\t%.2f\t%.3f\n", x, $2, rgb, $2, w * 0.9 }' >>"$work/targets.dat"
    if [ "$index" = 0 ]; then
      targets_of "$file" | awk -F'\t' '{ printf "%d\t%s\n", $1, $3 }' >"$work/lines.dat"
      ticks=$(targets_of "$file" | awk -F'\t' '{ printf "%s\"%s\" %d", (NR > 1 ? ", " : ""), $4, $1 }')
    fi
    plot+="NaN with boxes lc rgb $rgb title \"PostgreSQL $version\", "
    index=$((index + 1))
  done <<<"$files"
  [ -s "$work/targets.dat" ] || { echo "charts.sh: no results in $bench: no targets chart" >&2; return 0; }
  local measured
  measured=$(sed -nE 's/^Measured ([0-9-]+) on .*/\1/p' "$bench/results.md" 2>/dev/null | head -1)
  gnuplot <<GNUPLOT
${common//WIDTH,HEIGHT/1100,470}
set output "$bench/targets.svg"
set title "Single-node targets: each ratio against its floor (bars), and the target (red line); latest runs, ${measured:-}"
set ylabel "ratio (1.0 = as fast as the floor)"
set yrange [0:1.4]
set ytics 0.2
set xrange [0.5:$(($(wc -l <"$work/lines.dat") + 0)).5]
set xtics ($ticks) font ",9" scale 0
set bmargin 5.5
set datafile separator "\t"
set key top left horizontal
plot $plot \
     "$work/targets.dat" using 1:2:5:3 with boxes lc rgb variable notitle, \
     "$work/lines.dat" using (\$1 - 0.45):2:(0.9):(0) with vectors nohead lw 2.5 lc rgb "#c0392b" dt 1 title "target", \
     "$work/targets.dat" using 1:(0.05):4 with labels font ",9" textcolor rgb "white" notitle
GNUPLOT
  echo "drew $bench/targets.svg from $(awk '{ printf "%s ", $2 }' <<<"$files")"
}

# ---------------------------------------------------------------------------------
# The peers: requests/s and server CPU per request, synchronous_commit off
# ---------------------------------------------------------------------------------
# "workload<TAB>contender<TAB>requests/s<TAB>server CPU µs" for each row of a peers
# results file with synchronous_commit off, contenders named as below.
peers_rows() {
  awk -F'|' '
    function num(s) { sub(/ *\(.*/, "", s); gsub(/[^0-9.]/, "", s); return s }
    /^\| contender \| keys \|/ { table = "payment"; next }
    /^\| contender \| part \|/ { table = "messaging"; next }
    /^\| contender \| synchronous_commit \|/ { table = ""; next }
    /^\| ---/ || !/^\|/ { next }
    table == "payment" {
      c = $2; gsub(/ /, "", c); k = $3; gsub(/ /, "", k); s = $4; gsub(/ /, "", s)
      if (s == "off") printf "%s\t%s\t%s\t%s\n", k, c, num($5), num($8) }
    table == "messaging" {
      c = $2; sub(/^ /, "", c); sub(/ $/, "", c); p = $3; s = $4; gsub(/ /, "", s)
      if (s != "off") next
      if (p ~ /producer/) {
        w = "producer"; id = (c ~ /one CALL/) ? "extension_call" : c
      } else {
        w = "relay"; id = c
        if (p ~ /polling/) id = "library_polling"; else if (p ~ /logical/) id = "library_logical"
      }
      printf "%s\t%s\t%s\t%s\n", w, id, num($5), num($8) }' "$1"
}

peers_chart() {
  local files version file index=0 count plot="" rgb
  files=$(results_files "$bench/peers")
  [ -n "$files" ] || { echo "charts.sh: no results in $bench/peers: no peers chart" >&2; return 0; }
  count=$(wc -l <<<"$files")
  # The bars, in order: workload, contender, its title and colour.
  cat >"$work/peers.order" <<'ORDER'
new	extension	extension	#4c72b0
new	sqlOnly	SQL-only edition	#8172b3
new	appTable	table by hand	#dd8452
new	dbos	DBOS Transact	#c44e52
replay	extension	extension	#4c72b0
replay	sqlOnly	SQL-only edition	#8172b3
replay	appTable	table by hand	#dd8452
replay	dbos	DBOS Transact	#c44e52
producer	extension	extension	#4c72b0
producer	extension_call	extension, one CALL	#4c72b0
producer	library	outbox library	#55a868
relay	extension	extension	#4c72b0
relay	library_polling	library, polling	#55a868
relay	library_logical	library, replication	#55a868
ORDER
  : >"$work/peers.dat"
  while read -r version file; do
    peers_rows "$file" >"$work/rows-$version"
    # x: the bar's place (a gap between workloads), each version beside the others
    awk -F'\t' -v v="$index" -v n="$count" -v rows="$work/rows-$version" -v shade="$index" '
      BEGIN { while ((getline line < rows) > 0) { split(line, f, "\t"); rps[f[1], f[2]] = f[3]; cpu[f[1], f[2]] = f[4] } }
      function hex(s,   i, v) {
        v = 0; s = tolower(s)
        for (i = 1; i <= length(s); i++) v = v * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
        return v }
      function lighter(c, i,   r, g, b, f) {  # as version_shade
        r = hex(substr(c, 2, 2)); g = hex(substr(c, 4, 2)); b = hex(substr(c, 6, 2))
        f = i * 45; if (f > 80) f = 80
        return int(r + (255 - r) * f / 100) * 65536 + int(g + (255 - g) * f / 100) * 256 + int(b + (255 - b) * f / 100) }
      function commas(x,   s, out) {
        s = sprintf("%d", x + 0.5); out = ""
        while (length(s) > 3) { out = "," substr(s, length(s) - 2) out; s = substr(s, 1, length(s) - 3) }
        return s out }
      { if ($1 != last) { group++; last = $1 }
        place = NR + (group - 1) * 0.6; w = 0.8 / n; x = place - 0.4 + w * (v + 0.5)
        if (($1, $2) in rps)
          printf "%.3f\t%s\t%s\t%d\t%s\t%s\t%.3f\n", x, rps[$1, $2], cpu[$1, $2], lighter($4, shade),
                 commas(rps[$1, $2]), commas(cpu[$1, $2]), w * 0.9 }' "$work/peers.order" >>"$work/peers.dat"
    rgb=$(version_shade "$index" "#808080")
    plot+="NaN with boxes lc rgb $rgb title \"PostgreSQL $version\", "
    index=$((index + 1))
  done <<<"$files"
  # Ticks under each bar pair, the workloads' names above their groups.
  local ticks groups
  ticks=$(awk -F'\t' '{ if ($1 != last) { group++; last = $1 }
                        printf "%s\"%s\" %.2f", (NR > 1 ? ", " : ""), $3, NR + (group - 1) * 0.6 }' "$work/peers.order")
  groups=$(awk -F'\t' '{ if ($1 != last) { if (last != "") print last "\t" first "\t" prev
                                            group++; last = $1; first = NR + (group - 1) * 0.6 }
                          prev = NR + (group - 1) * 0.6 }
                        END { print last "\t" first "\t" prev }' "$work/peers.order" |
    awk -F'\t' 'BEGIN { name["new"] = "payment, new key"; name["replay"] = "payment, replay"
                        name["producer"] = "outbox: producer (4 statements, or one CALL)"
                        name["relay"] = "outbox: relay, 5,000 events" }
                { printf "set label \"%s\" at %.2f, graph 1.04 center font \",10\"\n", name[$1], ($2 + $3) / 2
                  if (NR > 1) printf "set arrow from %.2f, graph 0 to %.2f, graph 1 nohead lc rgb \"#b0b0b0\" dt 2\n", $2 - 0.8, $2 - 0.8 }')
  local last_x measured max_rps max_cpu
  max_rps=$(awk -F'\t' '$2 > m { m = $2 } END { print m * 1.2 }' "$work/peers.dat")
  max_cpu=$(awk -F'\t' '$3 > m { m = $3 } END { print m * 1.2 }' "$work/peers.dat")
  last_x=$(awk -F'\t' '{ if ($1 != last) { group++; last = $1 } x = NR + (group - 1) * 0.6 } END { print x + 0.6 }' "$work/peers.order")
  measured=$(sed -nE 's/^Measured ([0-9-]+) .*/\1/p' "$(awk 'NR == 1 { print $2 }' <<<"$files")" | head -1)
  gnuplot <<GNUPLOT
${common//WIDTH,HEIGHT/1000,760}
set output "$bench/peers/peers.svg"
set datafile separator "\t"
set multiplot layout 2,1 title "The extension and what a team would use instead (test/bench/peers, synchronous_commit off, 8 connections, 2 cores, ${measured:-})"
set xrange [0.4:$last_x]
set xtics ($ticks) rotate by -25 left font ",9" scale 0
set rmargin 10
$groups
set key top left horizontal
set tmargin 3
set bmargin 4.5
set lmargin 11
set ylabel "requests/s (more is better)"
set yrange [0:$max_rps]
plot $plot "$work/peers.dat" using 1:2:7:4 with boxes lc rgb variable notitle, \
     "$work/peers.dat" using 1:2:5 with labels rotate by 90 left offset 0,0.3 font ",8" notitle
set ylabel "server CPU µs per request (less is better)"
set yrange [0:$max_cpu]
set key off
plot "$work/peers.dat" using 1:3:7:4 with boxes lc rgb variable notitle, \
     "$work/peers.dat" using 1:3:6 with labels rotate by 90 left offset 0,0.3 font ",8" notitle
unset multiplot
GNUPLOT
  echo "drew $bench/peers/peers.svg from $(awk '{ printf "%s ", $2 }' <<<"$files")"
}

while read -r version file; do
  tps_chart "$version" "$file"
done < <(results_files "$bench")
targets_chart
peers_chart
