// The runs page (finetune/runs/page.py writes it). Everything a run wrote reaches the page through textContent,
// never as markup: el() below is the only way this script makes elements.
(function () {
  "use strict";
  var COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
                "#bcbd22"];
  var DASHES = [null, [6, 4], [2, 3], [10, 3, 2, 3]];  // the members of a grouped chart, one dash each
  // the curves every run has come first; then each method's own metrics, in name order
  var FIRST = ["loss", "eval_loss", "learning_rate", "grad_norm",
               "rewards/accuracies", "eval_rewards/accuracies", "rewards/margins", "eval_rewards/margins",  // preference
               "rewards/chosen, rejected", "eval_rewards/chosen, rejected",
               "reward", "rewards/*/mean", "completions/length", "completions/clipped_ratio", "entropy",  // GRPO
               "accuracy", "eval_accuracy", "margin", "eval_margin", "reward score", "eval_reward score"];  // reward models
  // metrics drawn together on one chart, each a member (its dash): GRPO's per reward function metrics, its lengths and
  // clip ratios, preference's chosen and rejected. [pattern, chart name, member name] from the regex's match.
  var GROUPS = [
    [/^(eval_)?rewards\/(.+)\/(mean|std|missing)$/, function (m) { return [(m[1] || "") + "rewards/*/" + m[3], m[2]]; }],
    [/^(eval_)?reward(_std)?$/, function (m) { return [(m[1] || "") + "reward", m[2] ? "std" : "mean"]; }],
    [/^(eval_)?completions\/(mean|min|max)_length$/, function (m) { return [(m[1] || "") + "completions/length", m[2]]; }],
    [/^(eval_)?completions\/(mean|min|max)_terminated_length$/,
     function (m) { return [(m[1] || "") + "completions/terminated length", m[2]]; }],
    [/^(eval_)?clip_ratio\/(.+)$/, function (m) { return [(m[1] || "") + "clip_ratio", m[2]]; }],
    [/^(eval_)?(rewards|logps)\/(chosen|rejected)$/, function (m) { return [(m[1] || "") + m[2] + "/chosen, rejected", m[3]]; }],
    // a reward model's scores: chosen, rejected and their mean on one chart (min / max beside them)
    [/^(eval_)?(chosen|rejected|mean|min|max)_reward$/, function (m) { return [(m[1] || "") + "reward score", m[2]]; }]
  ];
  var NOT_SET = "(not set)";
  var X_LABELS = {step: "optimizer step", epoch: "epoch", tokens: "tokens (step x the plan's tokens per step)"};
  var state = {x: "step", logY: false, smooth: 0, showAll: false, baseline: null, query: ""};
  var data = JSON.parse(document.getElementById("runs-data").textContent);
  var charts = [];

  function el(tag, props) {
    var node = document.createElement(tag);
    Object.keys(props || {}).forEach(function (key) {
      var value = props[key];
      if (value === null || value === undefined) return;
      if (key === "text") node.textContent = String(value);
      else if (key === "cls") node.className = value;
      else if (key === "style") node.style.cssText = value;
      else node.setAttribute(key, String(value));
    });
    for (var i = 2; i < arguments.length; i++) {
      var child = arguments[i];
      if (child === null || child === undefined) continue;
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function fmt(value, digits) {
    if (value === null || value === undefined) return "\u2014";
    if (typeof value !== "number") return String(value);
    if (Number.isInteger(value)) return value.toLocaleString("en");
    var abs = Math.abs(value);
    if (abs !== 0 && (abs < 1e-3 || abs >= 1e5)) return value.toExponential(2);
    return value.toFixed(digits === undefined ? 4 : digits);
  }

  function duration(seconds) {
    if (typeof seconds !== "number") return "\u2014";
    if (seconds < 120) return seconds.toFixed(1) + " s";
    if (seconds < 7200) return (seconds / 60).toFixed(1) + " min";
    return (seconds / 3600).toFixed(2) + " h";
  }

  // the palette, then hues a golden angle apart: no two runs share a colour however many there are
  function color(i) { return i < COLORS.length ? COLORS[i] : "hsl(" + ((i - COLORS.length) * 137.508 + 20) % 360 + ", 62%, " + (i % 2 ? 38 : 52) + "%)"; }
  function swatch(i) { return el("span", {cls: "swatch", style: "background:" + color(i)}); }
  function section(title, id) { return el("section", {id: id}, el("h2", {text: title})); }

  // --- the table of runs -------------------------------------------------------------------------------------
  function badge(diagnosis) {
    if (!diagnosis) return el("span", {cls: "muted", text: "no verdict"});
    var verdict = diagnosis.verdict;
    var node = el("span", {cls: "badge " + verdict.replace(/[^a-z0-9]+/gi, "-").toLowerCase(), title: diagnosis.reason,
                           "data-verdict": verdict, text: verdict});
    // a verdict that is no verdict says why beside it; the others on hover
    if (verdict !== "unknown" && verdict !== "too short" || !diagnosis.reason) return node;
    return el("div", {}, node, el("div", {cls: "verdict-reason muted", text: diagnosis.reason}));
  }

  function stepsText(run) {
    var s = run.summary;
    if (!run.stop && run.status === "finished") {
      return s.total_steps && s.total_steps !== s.steps ? fmt(s.steps) + " / " + fmt(s.total_steps) : fmt(s.steps);
    }
    // stopped before its end: where it resumes from (its checkpoint), the step it reached
    var at = s.checkpoint_step !== null && s.checkpoint_step !== undefined ? "checkpoint at " + fmt(s.checkpoint_step)
      : (run.stop || run.status !== "training" ? "no checkpoint" : fmt(s.steps));
    var reached = typeof s.reached_step === "number" && s.reached_step !== s.checkpoint_step ? ", stopped at " + fmt(s.reached_step) : "";
    return at + reached + (s.total_steps ? " of " + fmt(s.total_steps) : "");
  }

  function statusCell(run) {
    var cell = el("td", {}, el("span", {cls: "status " + run.status, title: run.status_reason, text: run.status}));
    if (run.status !== "finished") cell.appendChild(el("div", {cls: "status-reason muted", text: run.status_reason}));
    return cell;
  }

  function evalScores(evaluation) {
    if (!evaluation) return el("span", {cls: "muted", text: "not evaluated"});
    var list = el("div", {cls: "eval-scores"});
    evaluation.rows.forEach(function (row) {
      var sides = row[1], parts = [];
      ["base", "tuned", "gguf"].forEach(function (side) { if (side in sides) parts.push(side + " " + fmt(sides[side])); });
      list.appendChild(el("div", {text: row[0] + ": " + parts.join(" \u2192 ")}));
    });
    if (evaluation.verdict) list.appendChild(el("div", {cls: "muted", text: evaluation.verdict}));
    return list;
  }

  function runsTable() {
    var out = section("Runs", "runs");
    var head = ["run", "status", "method", "model", "adapter", "steps", "tokens", "wall time", "verdict",
                "eval loss before \u2192 after", "finetune eval"];
    var table = el("table", {cls: "runs-table"}, el("thead", {}, el("tr", {})));
    head.forEach(function (h) { table.tHead.rows[0].appendChild(el("th", {text: h})); });
    var body = el("tbody");
    data.runs.forEach(function (run, i) {
      var s = run.summary;
      body.appendChild(el("tr", {"data-status": run.status},
        el("td", {cls: "run-name", title: run.path}, swatch(i), el("span", {cls: "name", text: run.name})),
        statusCell(run),
        el("td", {text: fmt(s.method)}), el("td", {text: fmt(s.model)}), el("td", {text: fmt(s.adapter)}),
        el("td", {cls: "num steps", text: stepsText(run)}),
        el("td", {cls: "num", text: fmt(s.tokens) + (s.generated_tokens ? " (+" + fmt(s.generated_tokens) + " generated)" : "")}),
        el("td", {cls: "num", text: duration(s.wall_time_s)}),
        el("td", {cls: "verdict"}, badge(run.diagnosis)),
        el("td", {cls: "num", text: fmt(s.eval_loss_before) + " \u2192 " + fmt(s.final_eval_loss)}),
        el("td", {}, evalScores(run.evaluation))));
    });
    table.appendChild(body);
    out.appendChild(table);
    if (!data.runs.length) out.appendChild(el("p", {text: "No runs found under these folders."}));
    return out;
  }

  // --- curves --------------------------------------------------------------------------------------------------
  function grouped(metric) {  // [chart name, member name or null]
    for (var i = 0; i < GROUPS.length; i++) {
      var m = GROUPS[i][0].exec(metric);
      if (m) return GROUPS[i][1](m);
    }
    return [metric, null];
  }

  function chartGroups() {  // [[chart name, [[metric, member], ...]], ...] in the order charts are drawn
    var charts = {};
    data.runs.forEach(function (run) {
      Object.keys(run.curves).forEach(function (metric) {
        var g = grouped(metric), members = charts[g[0]] = charts[g[0]] || [];
        if (!members.some(function (m) { return m[0] === metric; })) members.push([metric, g[1]]);
      });
    });
    Object.keys(charts).forEach(function (name) {
      charts[name].sort(function (a, b) { return a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0; });
      if (charts[name].length === 1 && charts[name][0][0] === name) charts[name][0][1] = null;  // a chart of its own
    });
    var rest = Object.keys(charts).filter(function (m) { return FIRST.indexOf(m) < 0; }).sort();
    return FIRST.filter(function (m) { return charts[m]; }).concat(rest).map(function (m) { return [m, charts[m]]; });
  }

  function tick(value, digits) {  // `digits` significant digits; below 0.01 (and from 1e5) as 5e-4
    if (value === 0) return "0";
    var abs = Math.abs(value);
    if (abs < 0.01 || abs >= 1e5) return value.toExponential(digits - 1).replace(/\.?0*e/, "e").replace("e+", "e");
    return String(Number(value.toPrecision(digits)));
  }

  function tickLabels(splits) {  // the fewest significant digits that give every tick its value (2e-4, not 0; 0.25, not 0.3)
    var values = splits.filter(function (v) { return typeof v === "number"; });
    var spacing = values.length > 1 ? Math.abs(values[1] - values[0]) : Math.abs(values[0] || 1);
    for (var digits = 1; digits < 8; digits++) {
      var labels = splits.map(function (v) { return typeof v === "number" ? tick(v, digits) : ""; });
      var exact = splits.every(function (v, i) { return typeof v !== "number" || Math.abs(Number(labels[i]) - v) <= spacing * 1e-3; });
      if (exact) return labels;
    }
    return splits.map(function (v) { return typeof v === "number" ? tick(v, 8) : ""; });
  }

  function yRange(u, min, max) {  // uPlot gives a flat series 0-100; a flat series here sits mid-axis around its value
    if (min === null || max === null) return [0, 1];
    if (min !== max) return uPlot.rangeNum(min, max, 0.1, true);
    return min === 0 ? [0, 1] : [min - Math.abs(min) / 2, min + Math.abs(min) / 2];
  }

  function points(run, metric) {
    var perStep = run.summary.tokens_per_step, byX = new Map();
    (run.curves[metric] || []).forEach(function (p) {
      var x = state.x === "step" ? p[0] : state.x === "epoch" ? p[1] : (perStep ? p[0] * perStep : null);
      if (typeof x === "number" && typeof p[2] === "number") byX.set(x, p[2]);
    });
    var xs = Array.from(byX.keys()).sort(function (a, b) { return a - b; });
    var ys = xs.map(function (x) { return byX.get(x); });
    if (state.smooth > 0) {  // exponential moving average, debiased at the start (as TensorBoard's)
      var avg = 0, weight = 0;
      ys = ys.map(function (y) {
        avg = state.smooth * avg + (1 - state.smooth) * y;
        weight = state.smooth * weight + (1 - state.smooth);
        return avg / weight;
      });
    }
    return [xs, ys];
  }

  function chart(group, host) {
    var name = group[0], members = group[1];
    var box = el("div", {cls: "chart", "data-metric": name}, el("h3", {text: name}));
    host.appendChild(box);
    var tables = [], series = [{label: X_LABELS[state.x]}], missing = [], sparse = [];
    data.runs.forEach(function (run, i) {
      members.forEach(function (member, k) {
        var metric = member[0];
        if (!run.curves[metric]) return;
        var xy = points(run, metric);
        if (!xy[0].length) { if (missing.indexOf(run.name) < 0) missing.push(run.name); return; }
        tables.push(xy);
        series.push({label: member[1] ? run.name + " \u00b7 " + member[1] : run.name, stroke: color(i), width: 1.5,
                     dash: DASHES[k % DASHES.length] || undefined, spanGaps: true, points: {show: xy[0].length < 3}});
        var steps = run.summary.steps, every = run.summary.logging_steps;
        // a training metric logged every logging_steps: one or two values in a longer run, and why (eval_*: eval_steps)
        if (xy[0].length <= 2 && typeof steps === "number" && steps > xy[0].length && every > 1 && k === 0 &&
            metric.indexOf("eval_") !== 0) {
          sparse.push(run.name + ": " + xy[0].length + " value" + (xy[0].length === 1 ? "" : "s") + " in " + steps +
                      " steps: logged every " + every + " steps (logging_steps; the loss is kept at every step)");
        }
      });
    });
    if (!tables.length) {
      box.appendChild(el("p", {cls: "note", text: "no points on this axis"}));
      return;
    }
    var aligned = uPlot.join(tables);
    var positive = aligned.slice(1).every(function (ys) { return ys.every(function (y) { return y === null || y === undefined || y > 0; }); });
    var log = state.logY && positive;
    var yAxis = {values: function (u, splits) {
      var labels = tickLabels(splits);
      box.setAttribute("data-y-ticks", labels.join(" "));  // the canvas's tick labels, as text
      return labels;
    }};
    var ys = [].concat.apply([], aligned.slice(1)).filter(function (y) { return typeof y === "number"; });
    if (!log && ys.length && ys[0] !== 0 && ys.every(function (y) { return y === ys[0]; })) {
      yAxis.splits = function (u, axis, min, max) { return [min, (min + max) / 2, max]; };  // the value, mid-axis
    }
    var opts = {width: Math.max(320, (box.clientWidth || 460) - 4), height: 240, series: series,
                scales: {x: {time: false}, y: log ? {distr: 3} : {distr: 1, range: yRange}},
                axes: [{label: X_LABELS[state.x]}, yAxis], legend: {live: true}, cursor: {drag: {x: true, y: false}},
                hooks: {setScale: [function (u, key) {  // the y axis's ends, as text
                  if (key === "y") box.setAttribute("data-y-range", u.scales.y.min + " " + u.scales.y.max);
                }]}};
    charts.push(new uPlot(opts, aligned, box));
    if (state.logY && !positive) box.appendChild(el("p", {cls: "note", text: "linear: some values are \u2264 0"}));
    if (missing.length) box.appendChild(el("p", {cls: "note", text: "not on this axis (no token count): " + missing.join(", ")}));
    sparse.forEach(function (why) { box.appendChild(el("p", {cls: "note sparse", text: why})); });
  }

  function curves() {
    var out = section("Curves", "curves");
    var xSelect = el("select", {id: "x-axis"});
    ["step", "epoch", "tokens"].forEach(function (x) {
      var option = el("option", {value: x, text: x});
      option.selected = state.x === x;
      xSelect.appendChild(option);
    });
    xSelect.addEventListener("change", function () { state.x = xSelect.value; drawCharts(); });
    var logBox = el("input", {type: "checkbox", id: "log-y"});
    logBox.checked = state.logY;
    logBox.addEventListener("change", function () { state.logY = logBox.checked; drawCharts(); });
    var smooth = el("input", {type: "range", id: "smoothing", min: "0", max: "0.99", step: "0.01"});
    smooth.value = String(state.smooth);
    var shown = el("span", {text: state.smooth.toFixed(2)});
    smooth.addEventListener("input", function () {
      state.smooth = Number(smooth.value);
      shown.textContent = state.smooth.toFixed(2);
      drawCharts();
    });
    out.appendChild(el("div", {cls: "controls"},
      el("label", {}, "x axis ", xSelect), el("label", {}, logBox, " log y"),
      el("label", {}, "smoothing ", smooth, " ", shown)));
    out.appendChild(el("div", {cls: "charts", id: "charts"}));
    return out;
  }

  function drawCharts() {
    charts.forEach(function (c) { c.destroy(); });
    charts = [];
    var host = document.getElementById("charts");
    host.textContent = "";
    var groups = chartGroups();
    groups.forEach(function (g) { chart(g, host); });
    if (!groups.length) host.appendChild(el("p", {cls: "muted", text: "No curves: no run logged a metric yet."}));
  }

  // --- settings ------------------------------------------------------------------------------------------------
  function settings() {
    var out = section("Settings", "settings");
    var keys = {};
    data.runs.forEach(function (run) { Object.keys(run.settings).forEach(function (k) { keys[k] = true; }); });
    keys = Object.keys(keys).sort();
    var table = el("table", {cls: "settings" + (state.showAll ? " show-all" : "")});
    var head = el("tr", {}, el("th", {text: "setting"}));
    data.runs.forEach(function (run, i) { head.appendChild(el("th", {}, swatch(i), run.name)); });
    table.appendChild(el("thead", {}, head));
    var body = el("tbody"), differ = 0;
    // a run that recorded its recipe and lacks a key did not set it (an SFT run has no rewards[0]); a run that recorded
    // no recipe at all (an older folder) has nothing to say
    var hasRecipe = data.runs.map(function (run) { return Object.keys(run.settings).some(function (k) { return k.indexOf("recipe.") === 0; }); });
    keys.forEach(function (key) {
      var values = data.runs.map(function (run, i) {
        return key in run.settings ? run.settings[key] : (hasRecipe[i] && key.indexOf("recipe.") === 0 ? NOT_SET : null);
      });
      // a run that did not record a setting (an older run.json, a crashed run) makes no difference on its own
      var recorded = values.filter(function (v) { return v !== null; });
      var same = recorded.every(function (v) { return v === recorded[0]; });
      if (!same) differ++;
      var row = el("tr", {cls: same ? "same" : "differs", "data-key": key}, el("td", {text: key}));
      values.forEach(function (v) {
        row.appendChild(el("td", {cls: v === null || v === NOT_SET ? "muted" : "", text: v === null ? "(not recorded)" : v}));
      });
      body.appendChild(row);
    });
    table.appendChild(body);
    var toggle = el("input", {type: "checkbox", id: "show-all"});
    toggle.checked = state.showAll;
    toggle.addEventListener("change", function () { state.showAll = toggle.checked; table.classList.toggle("show-all", state.showAll); });
    out.appendChild(el("div", {cls: "controls"},
      el("span", {id: "settings-count", text: differ + " of " + keys.length + " settings differ (where recorded)"}),
      el("label", {}, toggle, " show all settings (the " + (keys.length - differ) + " equal ones too)")));
    out.appendChild(table);
    return out;
  }

  // --- evaluations side by side ------------------------------------------------------------------------------
  function evaluations() {
    var out = section("Evaluations", "evaluations");
    var rows = {}, order = [];
    data.runs.forEach(function (run) {
      ((run.evaluation || {}).rows || []).forEach(function (row) {
        if (!(row[0] in rows)) { rows[row[0]] = row[2]; order.push(row[0]); }
      });
    });
    if (!order.length) { out.appendChild(el("p", {cls: "muted", text: "No run has a `finetune eval` report."})); return out; }
    if (state.baseline === null) {  // the first run with an evaluation: a baseline without one shows no deltas
      state.baseline = data.runs.findIndex(function (run) { return run.evaluation && run.evaluation.rows.length; });
    }
    var select = el("select", {id: "baseline"});
    data.runs.forEach(function (run, i) {
      var option = el("option", {value: String(i), text: run.name});
      option.selected = state.baseline === i;
      select.appendChild(option);
    });
    select.addEventListener("change", function () { state.baseline = Number(select.value); render(); });
    out.appendChild(el("div", {cls: "controls"}, el("label", {}, "baseline run ", select)));
    function value(run, metric) {
      var found = ((run.evaluation || {}).rows || []).filter(function (r) { return r[0] === metric; })[0];
      if (!found) return null;
      var sides = found[1];
      return "tuned" in sides ? sides.tuned : ("base" in sides ? sides.base : null);
    }
    var table = el("table", {cls: "eval-table"});
    var head = el("tr", {}, el("th", {text: "metric (tuned)"}));
    data.runs.forEach(function (run, i) { head.appendChild(el("th", {}, swatch(i), run.name)); });
    table.appendChild(el("thead", {}, head));
    var body = el("tbody");
    order.forEach(function (metric) {
      var higher = rows[metric], base = data.runs[state.baseline] ? value(data.runs[state.baseline], metric) : null;
      var row = el("tr", {"data-metric": metric}, el("td", {text: metric + (higher ? " (higher is better)" : " (lower is better)")}));
      data.runs.forEach(function (run, i) {
        var v = value(run, metric), cell = el("td", {cls: "num", text: fmt(v)});
        if (typeof v === "number" && typeof base === "number" && i !== state.baseline) {
          var d = v - base, good = higher ? d > 0 : d < 0;
          cell.appendChild(el("span", {cls: "delta " + (d === 0 ? "" : good ? "better" : "worse"),
                                       text: " (" + (d >= 0 ? "+" : "") + fmt(d) + ")"}));
        }
        row.appendChild(cell);
      });
      body.appendChild(row);
    });
    var verdicts = el("tr", {}, el("td", {text: "verdict"}));
    data.runs.forEach(function (run) { verdicts.appendChild(el("td", {text: run.evaluation ? run.evaluation.verdict : "\u2014"})); });
    body.appendChild(verdicts);
    table.appendChild(body);
    out.appendChild(table);
    data.runs.forEach(function (run, i) {
      var hists = (run.evaluation || {}).histograms;
      if (hists) out.appendChild(histograms(run, i, hists));
    });
    return out;
  }

  // a reward run's held-out scores: per side, the chosen (green) and rejected (red) answers' histograms as bars
  function histograms(run, i, hists) {
    var box = el("div", {cls: "histograms", "data-run": run.name},
                 el("h3", {}, swatch(i), run.name + ": held-out scores, chosen (green) and rejected (red)"));
    ["base", "tuned"].forEach(function (side) {
      var h = hists[side];
      if (!h) return;
      var top = Math.max.apply(null, h.chosen.concat(h.rejected).concat([1]));
      var bars = el("div", {cls: "hist", "data-side": side});
      h.chosen.forEach(function (c, b) {
        var r = h.rejected[b], title = fmt(h.edges[b], 3) + " … " + fmt(h.edges[b + 1], 3) + ": chosen " + c +
          ", rejected " + r;
        bars.appendChild(el("div", {cls: "bin", title: title},
                            el("span", {cls: "bar chosen", style: "height:" + (100 * c / top).toFixed(1) + "%"}),
                            el("span", {cls: "bar rejected", style: "height:" + (100 * r / top).toFixed(1) + "%"})));
      });
      box.appendChild(el("div", {cls: "hist-side"}, el("div", {cls: "muted", text: side + " (scores " +
        fmt(h.edges[0], 3) + " … " + fmt(h.edges[h.edges.length - 1], 3) + ")"}), bars));
    });
    return box;
  }

  // --- sample answers ----------------------------------------------------------------------------------------
  function sampleNode(run, sample) {
    var meta = run.name + " \u00b7 " + (sample.source === "grpo" ? "GRPO completions" : "eval answers") +
      (sample.step !== null && sample.step !== undefined ? " \u00b7 step " + sample.step : "");
    var node = el("div", {cls: "sample"}, el("div", {cls: "meta", text: meta}), el("div", {text: "prompt"}),
                  el("pre", {cls: "prompt", text: sample.prompt}));
    if (sample.reference) node.appendChild(el("div", {cls: "meta", text: "reference: " + sample.reference}));
    var limit = sample.source === "grpo" ? "max_completion_length" : "max_new_tokens";
    sample.answers.forEach(function (a) {
      var label = a.label + (typeof a.reward === "number" ? " (reward " + fmt(a.reward) + ")" : "");
      var head = el("div", {text: label});
      if (a.truncated) head.appendChild(el("span", {cls: "truncated-mark", text: " cut at " + limit + " (unfinished)"}));
      node.appendChild(head);
      node.appendChild(el("pre", {cls: "answer" + (a.truncated ? " truncated" : ""), text: a.text}));
    });
    return node;
  }

  function samples() {
    var out = section("Sample answers", "samples");
    var all = [];
    data.runs.forEach(function (run) { run.samples.forEach(function (s) { all.push([run, s]); }); });
    var search = el("input", {type: "search", id: "sample-search", placeholder: "search prompts, answers and run names"});
    search.value = state.query;
    var count = el("span", {id: "sample-count"}), list = el("div", {id: "sample-list"});
    function show() {
      state.query = search.value;
      var q = state.query.toLowerCase(), shown = 0;
      list.textContent = "";
      all.forEach(function (pair) {
        var s = pair[1];
        var hay = [pair[0].name, s.prompt, s.reference || ""].concat(s.answers.map(function (a) { return a.text; })).join("\n").toLowerCase();
        if (q && hay.indexOf(q) < 0) return;
        shown++;
        if (shown <= 300) list.appendChild(sampleNode(pair[0], s));
      });
      count.textContent = shown + " of " + all.length + " prompts" + (shown > 300 ? " (the first 300 shown)" : "");
    }
    search.addEventListener("input", show);
    out.appendChild(el("div", {cls: "controls"}, search, count));
    out.appendChild(list);
    show();
    return out;
  }

  function render() {
    var page = document.getElementById("page");
    charts.forEach(function (c) { c.destroy(); });
    charts = [];
    page.textContent = "";
    document.getElementById("generated").textContent = data.runs.length + " run(s), read " + data.generated +
      (data.refresh_s ? "; refreshing every " + data.refresh_s + " s" : "") + " \u00b7 charts: uPlot " + data.uplot_version;
    page.appendChild(runsTable());
    page.appendChild(curves());
    drawCharts();
    page.appendChild(settings());
    page.appendChild(evaluations());
    page.appendChild(samples());
  }

  render();
  // served by `finetune runs --serve`: fetch the data again while runs train; redraw only when it changed
  if (data.refresh_s && location.protocol.indexOf("http") === 0) {
    setInterval(function () {
      fetch("data.json", {cache: "no-store"}).then(function (r) { return r.ok ? r.text() : null; }).then(function (text) {
        if (!text) return;
        var fresh = JSON.parse(text);
        if (JSON.stringify(fresh.runs) !== JSON.stringify(data.runs)) { data = fresh; render(); }
      }).catch(function () {});
    }, data.refresh_s * 1000);
  }
})();
