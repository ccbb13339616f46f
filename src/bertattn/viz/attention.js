/* bertattn attention viewer: head view (lines between query and key tokens) and model view
 * (every layer x head as a thumbnail). No network; the data is the JSON in #bertattn-data:
 *   idx: base64 of uint16 little-endian key indices, val: base64 of uint8 weights (w*255),
 *   both laid out [layer][head][query][k], the k kept keys of each query sorted by weight.
 * Test hook: window.bertattn (ready, firstPaintMs, lastDrawMs, setLayer, setHeads, hoverToken). */
(function () {
  "use strict";
  var T0 = performance.now();
  var D = JSON.parse(document.getElementById("bertattn-data").textContent);
  var N = D.n, K = D.k, H = D.heads, NL = D.layer_ids.length;
  var ROLL = D.rollout ? NL : -1;  // the rollout is the "layer" after the last one
  var ROW = 18, THUMB = Math.min(N, 48), BUCKETS = 16, LINE_BUDGET = 1500;

  function bytes(s) {
    var bin = atob(s), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  function u16(s) {
    var b = bytes(s);
    var little = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
    if (little) return new Uint16Array(b.buffer, 0, b.length >> 1);
    var out = new Uint16Array(b.length >> 1);
    for (var i = 0; i < out.length; i++) out[i] = b[2 * i] | (b[2 * i + 1] << 8);
    return out;
  }
  var IDX = u16(D.idx), VAL = bytes(D.val);
  var R = D.rollout ? { idx: u16(D.rollout.idx), val: bytes(D.rollout.val) } : null;
  var decodeMs = performance.now() - T0;

  function headColor(h) {
    return h < 0 ? "hsl(0, 0%, 30%)" : "hsl(" + Math.round((h * 360) / H) + ", 78%, 42%)";
  }
  // the sparse rows of one (layer, head): arrays plus the offset of query 0
  function block(layer, head) {
    if (layer === ROLL) return { idx: R.idx, val: R.val, off: 0 };
    return { idx: IDX, val: VAL, off: (layer * H + head) * N * K };
  }
  function visibleHeads() {
    if (state.layer === ROLL) return [-1];
    var out = [];
    for (var h = 0; h < H; h++) if (state.heads[h]) out.push(h);
    return out;
  }

  var state = {
    layer: 0, heads: [], threshold: 0.02, topk: Math.min(K, 8), focus: null, pinned: null,
  };
  for (var h0 = 0; h0 < H; h0++) state.heads.push(true);

  // ---- DOM -----------------------------------------------------------------------------------
  var $ = function (id) { return document.getElementById(id); };
  var canvas = $("lines"), ctx = canvas.getContext("2d", { willReadFrequently: true });
  // The canvas is only as tall as the visible part of the scroller (it is sticky inside a
  // column as tall as the token lists) and is redrawn on scroll: raster cost stays bounded by
  // the viewport, not by 512 tokens x 18 px.
  var scroller = $("head-scroller"), CW = 260, CH = 0, TOP = 0;
  $("canvas-col").style.height = N * ROW + "px";
  function sizeCanvas() {
    var dpr = window.devicePixelRatio || 1;
    CH = Math.max(ROW, Math.min(N * ROW, scroller.clientHeight || N * ROW));
    canvas.width = CW * dpr; canvas.height = CH * dpr;
    canvas.style.width = CW + "px"; canvas.style.height = CH + "px";
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  }
  var pending = false;
  function redrawSoon() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () { pending = false; draw(); });
  }
  scroller.addEventListener("scroll", redrawSoon, { passive: true });
  window.addEventListener("resize", function () { sizeCanvas(); redrawSoon(); });

  function tokenColumn(el, side) {
    var frag = document.createDocumentFragment();
    for (var i = 0; i < N; i++) {
      var s = document.createElement("span");
      s.className = "token" + (D.segment_start === i ? " seg-start" : "");
      s.textContent = D.tokens[i];
      s.title = i + ": " + D.tokens[i];
      s.dataset.i = i; s.dataset.side = side;
      frag.appendChild(s);
    }
    el.appendChild(frag);
    el.addEventListener("mouseover", function (e) {
      var t = e.target.closest(".token");
      if (t && !state.pinned) setFocus({ side: side, i: +t.dataset.i });
    });
    el.addEventListener("mouseleave", function () { if (!state.pinned) setFocus(null); });
    el.addEventListener("click", function (e) {
      var t = e.target.closest(".token");
      if (!t) return;
      var f = { side: side, i: +t.dataset.i };
      var same = state.pinned && state.pinned.side === f.side && state.pinned.i === f.i;
      state.pinned = same ? null : f;
      setFocus(f);
    });
  }
  tokenColumn($("tokens-left"), "left");
  tokenColumn($("tokens-right"), "right");
  var spans = { left: $("tokens-left").children, right: $("tokens-right").children };

  var sel = $("layer");
  D.layer_ids.forEach(function (id, i) { sel.add(new Option("Layer " + id, String(i))); });
  if (R) sel.add(new Option("Rollout (all layers)", String(ROLL)));
  sel.addEventListener("change", function () { setLayer(+sel.value); });

  var headBox = $("heads");
  for (var h1 = 0; h1 < H; h1++) {
    var lab = document.createElement("label");
    lab.className = "head-toggle";
    lab.innerHTML = '<input type="checkbox" checked><span class="swatch"></span>';
    lab.appendChild(document.createTextNode("H" + h1));
    lab.querySelector(".swatch").style.background = headColor(h1);
    lab.querySelector("input").dataset.head = h1;
    headBox.appendChild(lab);
  }
  headBox.addEventListener("change", function (e) {
    state.heads[+e.target.dataset.head] = e.target.checked;
    syncControls(); draw();
  });
  $("heads-all").addEventListener("click", function () { setHeads(null); });
  $("heads-none").addEventListener("click", function () { setHeads([]); });

  var thr = $("threshold"), topk = $("topk");
  thr.value = state.threshold; topk.max = K; topk.value = state.topk;
  thr.addEventListener("input", function () { state.threshold = +thr.value; syncControls(); draw(); });
  topk.addEventListener("input", function () { state.topk = +topk.value; syncControls(); draw(); });

  function syncControls() {
    sel.value = String(state.layer);
    var boxes = headBox.querySelectorAll("input");
    for (var i = 0; i < boxes.length; i++) {
      boxes[i].checked = state.heads[i];
      boxes[i].disabled = state.layer === ROLL;
      boxes[i].parentNode.classList.toggle("off", !state.heads[i] || state.layer === ROLL);
    }
    $("threshold-value").textContent = state.threshold.toFixed(2);
    $("topk-value").textContent = state.topk;
    var name = state.layer === ROLL ? "rollout" : "layer " + D.layer_ids[state.layer];
    var hs = visibleHeads();
    $("head-view-caption").textContent = state.layer === ROLL ? name
      : name + ", heads " + (hs.length === H ? "all" : hs.length ? hs.join(", ") : "none");
    var th = document.querySelectorAll(".thumbs canvas");
    for (var j = 0; j < th.length; j++) {
      var l = +th[j].dataset.layer, hh = +th[j].dataset.head;
      th[j].classList.toggle("selected", l === state.layer &&
        (l === ROLL || (hs.length === 1 && hs[0] === hh)));
    }
  }

  // ---- head view -----------------------------------------------------------------------------
  // The strongest drawable entries of the current view: (query, rank) within the top-k slider,
  // at or above the threshold. Without a focus token at most LINE_BUDGET lines are drawn (the
  // strongest): long lines across a tall canvas are what costs raster time, and thousands of
  // them are unreadable anyway. The cutoff is found from a histogram of the uint8 weights.
  function cutoff(heads, kk, cut) {
    var hist = new Uint32Array(256), total = 0;
    for (var a = 0; a < heads.length; a++) {
      var b = block(state.layer, heads[a] < 0 ? 0 : heads[a]);
      for (var q = 0; q < N; q++) {
        var base = b.off + q * K;
        for (var r = 0; r < kk; r++) {
          var v = b.val[base + r];
          if (v < cut) break;
          if (!visible(q, b.idx[base + r])) continue;
          hist[v]++; total++;
        }
      }
    }
    var c = 255, n = hist[255];
    while (c > cut && n + hist[c - 1] <= LINE_BUDGET) { c--; n += hist[c]; }
    if (total <= LINE_BUDGET) c = cut;
    return { cut: c, total: total, drawn: total <= LINE_BUDGET ? total : n };
  }

  // Is the line q -> j drawn? With a focus token: when it crosses the visible rows. Without:
  // only when both tokens are in view (lines leaving the view would all pile up at its edges).
  function visible(q, j) {
    var lo = TOP - ROW, hi = TOP + CH, a = q * ROW, b = j * ROW;
    if (state.focus) return !((a < lo && b < lo) || (a > hi && b > hi));
    return a >= lo && a <= hi && b >= lo && b <= hi;
  }

  function draw() {
    var t = performance.now();
    TOP = Math.min(scroller.scrollTop, Math.max(0, N * ROW - CH));
    ctx.clearRect(0, 0, CW, CH);
    var f = state.focus, heads = visibleHeads();
    var cut = Math.max(1, Math.ceil(state.threshold * 255 - 1e-9)), kk = state.topk;
    var info = null;
    if (!f) { info = cutoff(heads, kk, cut); cut = info.cut; }
    var x0 = 2, x1 = CW - 2, keyMass = f ? new Float32Array(N) : null;
    ctx.lineWidth = f ? 2.5 : 1.5;
    for (var a = 0; a < heads.length; a++) {
      var b = block(state.layer, heads[a] < 0 ? 0 : heads[a]);
      var paths = [];
      for (var p = 0; p < BUCKETS; p++) paths.push(new Path2D());
      var q0 = 0, q1 = N;
      if (f && f.side === "left") { q0 = f.i; q1 = f.i + 1; }
      for (var q = q0; q < q1; q++) {
        var base = b.off + q * K, yq = (q + 0.5) * ROW - TOP;
        for (var r = 0; r < kk; r++) {
          var v = b.val[base + r];
          if (v < cut) break;  // sorted by weight: the rest are smaller
          var j = b.idx[base + r];
          if (f && f.side === "right" && j !== f.i) continue;
          if (keyMass) keyMass[f.side === "left" ? j : q] += v / 255 / heads.length;
          if (!visible(q, j)) continue;
          var bk = Math.min(BUCKETS - 1, (v * BUCKETS) >> 8);
          paths[bk].moveTo(x0, yq); paths[bk].lineTo(x1, (j + 0.5) * ROW - TOP);
        }
      }
      ctx.strokeStyle = headColor(heads[a]);
      for (var p2 = 0; p2 < BUCKETS; p2++) {
        ctx.globalAlpha = f ? Math.min(1, 0.25 + (p2 + 1) / BUCKETS) : (p2 + 1) / BUCKETS;
        ctx.stroke(paths[p2]);
      }
    }
    ctx.globalAlpha = 1;
    ctx.getImageData(0, 0, 1, 1);  // force the raster now, so the time below is honest
    shadeTokens(f, keyMass);
    $("lines-info").textContent = info
      ? (info.drawn < info.total
        ? "showing the " + info.drawn + " strongest of " + info.total +
          " lines between tokens in view (weight \u2265 " + (info.cut / 255).toFixed(3) + "); hover a token for all of its own"
        : info.total + " lines between tokens in view")
      : "";
    api.lastDrawMs = performance.now() - t;
    api.drawCount++;
    return api.lastDrawMs;
  }

  var shaded = [];
  function shadeTokens(f, mass) {
    for (var i = 0; i < shaded.length; i++) shaded[i].style.background = "";
    shaded = [];
    var all = document.querySelectorAll(".token.focus, .token.pinned");
    for (var c = 0; c < all.length; c++) all[c].classList.remove("focus", "pinned");
    if (!f) return;
    spans[f.side][f.i].classList.add("focus");
    if (state.pinned) spans[f.side][f.i].classList.add("pinned");
    var other = spans[f.side === "left" ? "right" : "left"];
    for (var j = 0; j < N; j++) {
      if (mass[j] > 0) {
        other[j].style.background = "rgba(245, 158, 11, " + Math.min(1, mass[j] * 1.5) + ")";
        shaded.push(other[j]);
      }
    }
  }

  function setFocus(f) { state.focus = f; return draw(); }
  function setLayer(i) {
    if (!(i >= 0 && i < NL) && i !== ROLL) throw new RangeError("layer index " + i);
    state.layer = i; syncControls(); return draw();
  }
  function setHeads(list) {
    for (var h = 0; h < H; h++) state.heads[h] = list === null || list.indexOf(h) >= 0;
    syncControls(); return draw();
  }

  // ---- model view ----------------------------------------------------------------------------
  function drawThumb(cv, b) {
    var S = THUMB, acc = new Float32Array(S * S), max = 0;
    for (var q = 0; q < N; q++) {
      var row = Math.floor((q * S) / N) * S, base = b.off + q * K;
      for (var r = 0; r < K; r++) {
        var v = b.val[base + r];
        if (v === 0) break;
        var c = row + Math.floor((b.idx[base + r] * S) / N);
        if (v > acc[c]) { acc[c] = v; if (v > max) max = v; }
      }
    }
    cv.width = S; cv.height = S;
    var g = cv.getContext("2d"), img = g.createImageData(S, S), px = img.data;
    for (var i = 0; i < S * S; i++) {
      var s = max ? Math.sqrt(acc[i] / max) : 0;  // sqrt: small weights stay visible
      px[4 * i] = 255 - s * 233; px[4 * i + 1] = 255 - s * 190; px[4 * i + 2] = 255 - s * 120;
      px[4 * i + 3] = 255;
    }
    g.putImageData(img, 0, 0);
  }
  function buildThumbs() {
    var box = $("thumbs");
    box.style.gridTemplateColumns = "max-content repeat(" + H + ", 50px)";
    box.appendChild(document.createElement("span"));
    for (var h = 0; h < H; h++) {
      var hl = document.createElement("span");
      hl.className = "lab"; hl.textContent = "H" + h; hl.style.color = headColor(h);
      box.appendChild(hl);
    }
    var layers = D.layer_ids.map(function (id, i) { return [i, "L" + id]; });
    if (R) layers.push([ROLL, "rollout"]);
    layers.forEach(function (pair) {
      var l = pair[0], lab = document.createElement("span");
      lab.className = "lab"; lab.textContent = pair[1];
      box.appendChild(lab);
      var n = l === ROLL ? 1 : H;
      for (var h = 0; h < n; h++) {
        var cv = document.createElement("canvas");
        cv.dataset.layer = l; cv.dataset.head = h;
        cv.title = (l === ROLL ? "rollout" : "layer " + D.layer_ids[l] + ", head " + h);
        drawThumb(cv, block(l, h));
        cv.addEventListener("click", openThumb);
        box.appendChild(cv);
      }
    });
  }
  function openThumb(e) {
    var l = +e.target.dataset.layer, h = +e.target.dataset.head;
    state.layer = l;
    if (l !== ROLL) for (var i = 0; i < H; i++) state.heads[i] = i === h;
    state.pinned = null; state.focus = null;
    syncControls(); draw();
    $("head-view").scrollIntoView({ block: "nearest" });
  }

  var api = {
    ready: false, firstPaintMs: null, decodeMs: decodeMs, lastDrawMs: null, drawCount: 0,
    layers: NL, heads: H, tokens: N, hasRollout: !!R,
    state: function () { return JSON.parse(JSON.stringify(state)); },
    setLayer: setLayer, setHeads: setHeads,
    setLineBudget: function (n) { LINE_BUDGET = n; return draw(); },
    hoverToken: function (i, side) { setFocus({ side: side || "left", i: i }); return api.lastDrawMs; },
    clearHover: function () { state.pinned = null; return setFocus(null); },
  };
  window.bertattn = api;

  sizeCanvas();
  syncControls();
  draw();
  buildThumbs();
  syncControls();
  api.firstPaintMs = performance.now();
  api.ready = true;
})();
