// ganda attention viewer: one per div.gv, its data in the JSON script element its data-src names.
// Hover a token: its row (what it reads from) and its column (who reads it) colour the two token
// strips and cross the matrix; click locks the choice (click again to release). No dependencies.
(function () {
  "use strict";
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function fmt(v, kind) {
    if (kind === "implicit") return Math.abs(v) >= 1e-3 || v === 0 ? v.toPrecision(3) : v.toExponential(2);
    return v.toFixed(3);
  }
  function colour(v, top, kind) {
    var a = Math.min(1, Math.abs(v) / (top || 1));
    if (kind === "implicit" && v < 0) return "rgba(33,102,172," + a.toFixed(3) + ")";
    if (kind === "implicit") return "rgba(178,24,43," + a.toFixed(3) + ")";
    return "rgba(37,99,235," + a.toFixed(3) + ")";
  }
  function Viewer(root, data) {
    this.root = root; this.data = data; this.p = 0; this.h = 0; this.sel = null; this.locked = false;
    this.sink = true; this.build();
  }
  Viewer.prototype.prompt = function () { return this.data.prompts[this.p]; };
  Viewer.prototype.head = function () { return this.prompt().heads[this.h]; };
  Viewer.prototype.value = function (r, c) {
    var h = this.head(); var row = h.q[r];
    return row && c < row.length ? row[c] * h.scale / this.data.levels : 0;
  };
  Viewer.prototype.rowOf = function (i) { return this.prompt().rows.indexOf(i); };
  Viewer.prototype.build = function () {
    var self = this, root = this.root;
    root.textContent = "";
    var bar = el("div", "gv-bar");
    this.headBar = el("span", "gv-group"); this.promptBar = el("span", "gv-group");
    var sinkLab = el("label", "gv-opt"), sink = el("input");
    sink.type = "checkbox"; sink.checked = true;
    sink.addEventListener("change", function () { self.sink = sink.checked; self.paint(); });
    sinkLab.appendChild(sink); sinkLab.appendChild(document.createTextNode(" scale without the first token"));
    bar.appendChild(this.headBar); bar.appendChild(this.promptBar); bar.appendChild(sinkLab);
    root.appendChild(bar);
    this.info = el("div", "gv-info"); root.appendChild(this.info);
    var body = el("div", "gv-body"), strips = el("div", "gv-strips");
    this.rowStrip = this.strip(strips, "row", "reads from: the selected token's row");
    this.colStrip = this.strip(strips, "col", "read by: the selected token's column");
    body.appendChild(strips);
    var side = el("div", "gv-side");
    this.canvas = el("canvas", "gv-mat"); side.appendChild(this.canvas);
    side.appendChild(el("div", "gv-cap", "map (rows: queries, columns: keys); the cross marks the selected token"));
    this.scaleNote = el("div", "gv-cap"); side.appendChild(this.scaleNote);
    this.legend = el("div", "gv-legend"); side.appendChild(this.legend);
    body.appendChild(side); root.appendChild(body);
    this.canvas.addEventListener("mousemove", function (ev) { self.canvasPick(ev, false); });
    this.canvas.addEventListener("click", function (ev) { self.canvasPick(ev, true); });
    this.canvas.addEventListener("mouseleave", function () { self.leave(); });
    this.buttons(); this.load();
  };
  Viewer.prototype.strip = function (parent, which, title) {
    var box = el("div", "gv-stripbox");
    box.appendChild(el("div", "gv-striptitle", title));
    var s = el("div", "gv-strip"); s.setAttribute("data-strip", which);
    box.appendChild(s); parent.appendChild(box);
    var self = this;
    s.addEventListener("mouseleave", function () { self.leave(); });
    return s;
  };
  Viewer.prototype.buttons = function () {
    var self = this;
    function group(bar, label, items, cur, pick) {
      bar.textContent = ""; bar.appendChild(el("span", "gv-lab", label));
      items.forEach(function (txt, i) {
        var b = el("button", "gv-btn" + (i === cur ? " on" : ""), txt);
        b.setAttribute("data-i", i);
        b.addEventListener("click", function () { pick(i); });
        bar.appendChild(b);
      });
    }
    group(this.headBar, "head", this.prompt().heads.map(function (h) {
      var named = h.role === "gather" || h.role === "aggregate";
      return (named ? h.role.charAt(0).toUpperCase() + h.role.slice(1) + " " : "") + h.name + " (" + h.kind + ")";
    }), this.h, function (i) { self.h = i; self.buttons(); self.paint(); });
    this.promptBar.style.display = this.data.prompts.length > 1 ? "" : "none";
    group(this.promptBar, "prompt", this.data.prompts.map(function (p) { return p.label; }), this.p,
      function (i) { self.p = i; self.h = Math.min(self.h, self.prompt().heads.length - 1); self.buttons(); self.load(); });
  };
  Viewer.prototype.load = function () {
    var self = this, p = this.prompt();
    this.segOf = p.tokens.map(function () { return -1; });
    p.segments.forEach(function (s, k) { for (var i = s[0]; i >= 0 && i <= s[1]; i++) self.segOf[i] = k; });
    [this.rowStrip, this.colStrip].forEach(function (strip) {
      strip.textContent = "";
      p.tokens.forEach(function (t, i) {
        var nl = t.indexOf("\n") >= 0;
        var span = el("span", "gv-tok", nl ? t.replace(/\n/g, "\u21b5") : t);
        span.setAttribute("data-i", i);
        var k = self.segOf[i];
        if (k >= 0) {
          span.className += " seg" + (k % 2) + (k === p.gold ? " gold" : "");
          if (p.segments[k][1] === i) span.className += " summ";
        }
        if (self.rowOf(i) < 0) span.className += " norow";
        if (p.marks && p.marks.indexOf(i) >= 0) span.className += " mark";
        if (i > 0 && p.pos[i] !== p.pos[i - 1] + 1) strip.appendChild(el("span", "gv-gap", "\u2026"));
        span.addEventListener("mouseenter", function () { if (!self.locked) self.select(i); });
        span.addEventListener("click", function () { self.click(i); });
        strip.appendChild(span);
        if (nl) strip.appendChild(el("br"));
      });
    });
    this.legend.textContent = "";
    var leg = [["seg0", "segment"], ["summ", "segment's last token (its summary)"]];
    if (p.gold !== null && p.gold !== undefined) leg.push(["gold", "gold segment"]);
    if (p.marks && p.marks.length) leg.push(["mark", p.mark_label]);
    leg.forEach(function (x) {
      var s = el("span", "gv-tok " + x[0], "tok"); self.legend.appendChild(s);
      self.legend.appendChild(document.createTextNode(" " + x[1] + "  "));
    });
    if (p.pos.length < p.T) this.legend.appendChild(el("div", "gv-note", "sampled: " + p.pos.length + " of " + p.T +
      " tokens shown (the first, the last ones, the segments, then back from the end); \u2026 marks a gap"));
    this.sel = null; this.locked = false; this.paint();
  };
  Viewer.prototype.defaultSel = function () { var r = this.prompt().rows; return r[r.length - 1]; };
  Viewer.prototype.select = function (i) { this.sel = i; this.paint(); };
  Viewer.prototype.click = function (i) {
    if (this.locked && this.sel === i) { this.locked = false; } else { this.locked = true; this.sel = i; }
    this.paint();
  };
  Viewer.prototype.leave = function () { if (!this.locked) { this.sel = null; this.paint(); } };
  Viewer.prototype.canvasPick = function (ev, lock) {
    var p = this.prompt(), rect = this.canvas.getBoundingClientRect();
    var r = Math.floor((ev.clientY - rect.top) / rect.height * p.rows.length);
    if (r < 0 || r >= p.rows.length) return;
    if (lock) this.click(p.rows[r]); else if (!this.locked) this.select(p.rows[r]);
  };
  Viewer.prototype.top = function (vals) {
    var h = this.head(), m = 0;
    for (var i = this.sink ? 1 : 0; i < vals.length; i++) m = Math.max(m, Math.abs(vals[i]));
    if (!m) m = h.kind === "implicit" ? h.scale : 1;
    return h.kind === "implicit" || this.sink ? m : 1;
  };
  Viewer.prototype.paintStrip = function (strip, vals) {
    var h = this.head(), top = this.top(vals), toks = strip.querySelectorAll(".gv-tok");
    for (var i = 0; i < toks.length; i++) {
      var v = vals[i], t = toks[i];
      if (v === null) { t.style.background = ""; t.removeAttribute("data-v"); t.title = ""; }
      else {
        t.style.background = colour(v, top, h.kind);
        t.style.color = Math.abs(v) / top > 0.6 ? "#fff" : "";
        t.setAttribute("data-v", fmt(v, h.kind)); t.title = fmt(v, h.kind);
      }
      t.classList.toggle("sel", i === this.sel);
      t.classList.toggle("clip", v !== null && Math.abs(v) > top * 1.001);
    }
  };
  Viewer.prototype.paint = function () {
    var p = this.prompt(), h = this.head(), n = p.tokens.length, self = this;
    var sel = this.sel === null ? this.defaultSel() : this.sel, r = this.rowOf(sel);
    this.cur = sel;
    var rowVals = [], colVals = [];
    for (var c = 0; c < n; c++) rowVals.push(r >= 0 ? this.value(r, c) : null);
    for (var i = 0; i < n; i++) { var ri = this.rowOf(i); colVals.push(ri >= 0 ? this.value(ri, sel) : null); }
    var keep = this.sel; this.sel = sel;
    this.paintStrip(this.rowStrip, rowVals); this.paintStrip(this.colStrip, colVals);
    this.sel = keep;
    this.rowStrip.setAttribute("data-sel", sel); this.colStrip.setAttribute("data-sel", sel);
    this.root.setAttribute("data-head", h.name); this.root.setAttribute("data-prompt", this.p);
    var best = rowVals.map(function (v, c) { return [v === null ? 0 : Math.abs(v), c]; })
      .sort(function (a, b) { return b[0] - a[0]; }).slice(0, 3).filter(function (x) { return x[0] > 0; });
    var seg = this.segOf[sel], where = seg < 0 ? "" : " \u00b7 segment " + seg + (seg === p.gold ? " (gold)" : "");
    this.info.textContent = (this.locked ? "locked (click again to release): " : (this.sel === null ? "final token: " : "")) +
      "token " + p.pos[sel] + " \u201c" + p.tokens[sel].replace(/\n/g, "\u21b5") + "\u201d" + where +
      (r < 0 ? " \u00b7 no row drawn for this token" : " \u00b7 reads most from " + best.map(function (x) {
        var s = self.segOf[x[1]];
        return "\u201c" + p.tokens[x[1]].replace(/\n/g, "\u21b5") + "\u201d@" + p.pos[x[1]] +
          (s >= 0 ? " (seg " + s + (s === p.gold ? ", gold" : "") + ")" : "") + " " + fmt(rowVals[x[1]], h.kind);
      }).join(", "));
    this.scaleNote.textContent = (h.kind === "implicit" ? "exact implicit map, signed: red positive, blue negative"
      : "softmax: darker blue reads more") + (this.sink ? "; colours scaled to the largest entry past the first token"
      + " (a larger first-token entry is dotted)" : "; colours on the full scale");
    this.drawMatrix(sel, r);
  };
  Viewer.prototype.drawMatrix = function (sel, r) {
    var p = this.prompt(), h = this.head(), rows = p.rows.length, n = p.tokens.length;
    var cell = Math.max(1, Math.min(8, Math.floor(320 / Math.max(n, rows))));
    var cv = this.canvas; cv.width = n * cell; cv.height = rows * cell;
    var ctx = cv.getContext("2d"), top = 0;
    for (var a = 0; a < rows; a++) for (var b = this.sink ? 1 : 0; b < h.q[a].length; b++) top = Math.max(top, Math.abs(h.q[a][b]));
    top = (top || this.data.levels) * h.scale / this.data.levels;
    if (h.kind !== "implicit" && !this.sink) top = 1;
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, cv.width, cv.height);
    for (var i = 0; i < rows; i++) for (var j = 0; j < h.q[i].length; j++) {
      var v = this.value(i, j);
      if (v !== 0) { ctx.fillStyle = colour(v, top, h.kind); ctx.fillRect(j * cell, i * cell, cell, cell); }
    }
    ctx.strokeStyle = "rgba(245,158,11,.9)"; ctx.lineWidth = 1;
    if (r >= 0) ctx.strokeRect(0.5, r * cell + 0.5, cv.width - 1, cell);
    ctx.strokeRect(sel * cell + 0.5, 0.5, cell, cv.height - 1);
  };
  function boot() {
    var nodes = document.querySelectorAll("div.gv[data-src]");
    for (var i = 0; i < nodes.length; i++) {
      var src = document.getElementById(nodes[i].getAttribute("data-src"));
      if (!src) continue;
      try { nodes[i].gv = new Viewer(nodes[i], JSON.parse(src.textContent)); }
      catch (e) { nodes[i].textContent = "attention view unavailable: " + e; }
    }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot); else boot();
})();
