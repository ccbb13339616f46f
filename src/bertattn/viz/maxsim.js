/* bertattn MaxSim view (a multi-vector model's page; runs after attention.js, which it leaves
 * alone): one row per query token, a line to the document token its row matched best (the
 * MaxSim argmax) with the score, skip-list tokens shown struck through and never matched, and
 * the whole (query tokens x document tokens) similarity matrix as a heatmap. The data is
 * #bertattn-data's "maxsim" (bertattn/jobs/attend_maxsim.py, MaxSimView.to_dict); a page
 * without it shows no such view. Every label is in S below, in English and Chinese, following
 * the page's language button.
 * Test hook: window.bertattn.maxsim (rows, hover, clear, focus, lang). */
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("bertattn-data").textContent);
  var M = D.maxsim;
  if (!M) return;
  var S = {
    en: {
      title: "MaxSim view", total: "{name} {total} (similarity of the pair)",
      hint: "Left: the query (TEXT) as the model encodes it, right: the document (--pair). " +
        "Each line joins a query token to the document token whose row matched it best " +
        "(the MaxSim argmax), with that score; {name} = {how}. Hover a token to isolate it.",
      howSum: "the sum of the {n} scores", howMean: "the mean of the {n} scores",
      info: "The attention views (head view, model view) are the encoder's on the query (with " +
        "its prompt) and the document (with its prompt) as one pair, one forward; the rows " +
        "scored here come from encoding each alone (encode_query / encode_document).",
      skipped: "skipped", skippedTitle: "on the skip-list: no row, not matched",
      matrix: "Similarity matrix", matrixHint: "rows: query tokens, columns: document " +
        "tokens; color: q · d from −{s} (blue) to +{s} (orange), grey: skipped; the marked " +
        "cell of each row is its match.",
      matchTitle: "{i} “{q}” → {j} “{d}”: {s}",
      cellTitle: "query {i} “{q}” · document {j} “{d}”: {s}",
    },
    zh: {
      title: "MaxSim 视图", total: "{name} {total}（这对文本的相似度）",
      hint: "左边是模型编码的查询（TEXT），右边是文档（--pair）。每条线把一个查询词元连到与它最" +
        "相似的文档词元（MaxSim 的 argmax），并标出分数；{name} = {how}。悬停在词元上只看它。",
      howSum: "{n} 个分数之和", howMean: "{n} 个分数的平均",
      info: "注意力视图（头视图、模型视图）是编码器对查询（带提示词）和文档（带提示词）作为一对文本的一次" +
        "前向计算；这里打分的向量来自分别编码两者（encode_query / encode_document）。",
      skipped: "跳过", skippedTitle: "在跳过列表中：没有向量，不参与匹配",
      matrix: "相似度矩阵", matrixHint: "行：查询词元，列：文档词元；颜色：q · d，从 −{s}（蓝）" +
        "到 +{s}（橙），灰色：跳过；每行标出的格子是它的匹配。",
      matchTitle: "{i}「{q}」→ {j}「{d}」：{s}",
      cellTitle: "查询 {i}「{q}」· 文档 {j}「{d}」：{s}",
    },
  };
  var ROW = 18, CW = 220;
  var NQ = M.query_tokens.length, ND = M.document_tokens.length;
  var qSkip = {}, dSkip = {}, best = {};
  M.query_skipped.forEach(function (i) { qSkip[i] = true; });
  M.document_skipped.forEach(function (j) { dSkip[j] = true; });
  M.matches.forEach(function (m) { best[m.query_index] = m; });
  var maxScore = 1e-12, absMax = 1e-12;
  M.matches.forEach(function (m) { maxScore = Math.max(maxScore, Math.abs(m.score)); });
  M.matrix.forEach(function (row) {
    row.forEach(function (x) { if (x !== null) absMax = Math.max(absMax, Math.abs(x)); });
  });
  var focus = null;  // {side: "query" | "doc", i}

  var $ = function (id) { return document.getElementById(id); };
  function lang() {
    return document.documentElement.lang === "zh-CN" ? "zh" : "en";
  }
  function t(key, p) {
    var s = S[lang()][key];
    return s.replace(/\{(\w+)\}/g, function (m, name) {
      return p && Object.prototype.hasOwnProperty.call(p, name) ? String(p[name]) : m;
    });
  }
  function span(cls, text) {
    var e = document.createElement("span");
    e.className = cls;
    e.textContent = text;
    return e;
  }
  function column(box, tokens, skip, side) {
    for (var i = 0; i < tokens.length; i++) {
      var row = document.createElement("span");
      row.className = "token" + (skip[i] ? " skipped" : "");
      row.dataset.i = i; row.dataset.side = side;
      row.appendChild(span("i", String(i)));
      row.appendChild(span("t", tokens[i]));
      if (side === "query") {
        var m = best[i];
        row.appendChild(span("s", m ? m.score.toFixed(3) : ""));
        if (m) { row.dataset.match = m.document_index; row.dataset.score = m.score; }
      }
      box.appendChild(row);
    }
    box.addEventListener("mouseover", function (e) {
      var tk = e.target.closest(".token");
      if (tk) setFocus({ side: side, i: +tk.dataset.i });
    });
    box.addEventListener("mouseleave", function () { setFocus(null); });
  }
  column($("maxsim-query"), M.query_tokens, qSkip, "query");
  column($("maxsim-doc"), M.document_tokens, dSkip, "doc");
  var qRows = $("maxsim-query").children, dRows = $("maxsim-doc").children;

  var canvas = $("maxsim-lines"), ctx = canvas.getContext("2d");
  var CH = Math.max(NQ, ND) * ROW;
  $("maxsim-canvas-col").style.height = CH + "px";
  function draw() {
    var dpr = window.devicePixelRatio || 1;
    canvas.width = CW * dpr; canvas.height = CH * dpr;
    canvas.style.width = CW + "px"; canvas.style.height = CH + "px";
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, CW, CH);
    var drawn = 0;
    M.matches.forEach(function (m) {
      var on = !focus || (focus.side === "query" ? focus.i === m.query_index
        : focus.i === m.document_index);
      if (!on) return;
      var w = Math.max(0.15, Math.abs(m.score) / maxScore);
      ctx.strokeStyle = focus ? "rgba(217, 45, 32, 0.95)" : "rgba(217, 72, 15, " + w + ")";
      ctx.lineWidth = focus ? 2.5 : 1 + w;
      ctx.beginPath();
      ctx.moveTo(0, m.query_index * ROW + ROW / 2);
      ctx.lineTo(CW, m.document_index * ROW + ROW / 2);
      ctx.stroke();
      drawn++;
    });
    api.drawn = drawn;
  }
  function setFocus(f) {
    focus = f;
    var i;
    for (i = 0; i < qRows.length; i++) qRows[i].classList.remove("focus", "match");
    for (i = 0; i < dRows.length; i++) dRows[i].classList.remove("focus", "match");
    if (f && f.side === "query") {
      qRows[f.i].classList.add("focus");
      if (best[f.i]) dRows[best[f.i].document_index].classList.add("match");
    } else if (f) {
      dRows[f.i].classList.add("focus");
      M.matches.forEach(function (m) {
        if (m.document_index === f.i) qRows[m.query_index].classList.add("match");
      });
    }
    draw();
  }

  function heatmap() {
    var cv = $("maxsim-heatmap"), cell = Math.max(3, Math.min(14, Math.floor(600 / ND)));
    cv.width = ND; cv.height = NQ;
    cv.style.width = ND * cell + "px"; cv.style.height = NQ * cell + "px";
    var g = cv.getContext("2d"), img = g.createImageData(ND, NQ), px = img.data;
    for (var i = 0; i < NQ; i++) {
      for (var j = 0; j < ND; j++) {
        var x = M.matrix[i][j], o = 4 * (i * ND + j), r, gg, b;
        if (x === null) { r = 228; gg = 231; b = 236; }
        else if (best[i] && best[i].document_index === j) { r = 127; gg = 29; b = 29; }
        else {
          var s = Math.min(1, Math.abs(x) / absMax);
          if (x >= 0) { r = 255 - s * 38; gg = 255 - s * 183; b = 255 - s * 240; }
          else { r = 255 - s * 227; gg = 255 - s * 129; b = 255 - s * 41; }
        }
        px[o] = r; px[o + 1] = gg; px[o + 2] = b; px[o + 3] = 255;
      }
    }
    g.putImageData(img, 0, 0);
    cv.addEventListener("mousemove", function (e) {  // the cell under the pointer, in words
      var box = cv.getBoundingClientRect();
      var i = Math.floor(((e.clientY - box.top) / box.height) * NQ);
      var j = Math.floor(((e.clientX - box.left) / box.width) * ND);
      if (i < 0 || j < 0 || i >= NQ || j >= ND) return;
      var x = M.matrix[i][j];
      cv.title = t("cellTitle", {
        i: i, q: M.query_tokens[i], j: j, d: M.document_tokens[j],
        s: x === null ? t("skipped") : x.toFixed(4),
      });
    });
  }

  function labels() {
    var name = M.similarity_fn_name === "meanmaxsim" ? "mean-MaxSim" : "MaxSim";
    var n = M.matches.length;
    $("maxsim-title").textContent = t("title");
    $("maxsim-total").textContent = t("total", { name: name, total: M.total.toFixed(4) });
    $("maxsim-hint").textContent = t("hint", {
      name: name, how: t(M.similarity_fn_name === "meanmaxsim" ? "howMean" : "howSum", { n: n }),
    });
    $("maxsim-info").textContent = t("info");
    $("maxsim-matrix-title").textContent = t("matrix");
    $("maxsim-matrix-hint").textContent = t("matrixHint", { s: absMax.toFixed(3) });
    for (var i = 0; i < qRows.length; i++) {
      var m = best[i];
      if (qSkip[i]) {
        qRows[i].querySelector(".s").textContent = t("skipped");
        qRows[i].title = i + ": " + M.query_tokens[i] + " \u2014 " + t("skippedTitle");
      } else if (m) {
        qRows[i].title = t("matchTitle", {
          i: i, q: M.query_tokens[i], j: m.document_index,
          d: M.document_tokens[m.document_index], s: m.score.toFixed(4),
        });
      }
    }
    for (var j = 0; j < dRows.length; j++) {
      dRows[j].title = j + ": " + M.document_tokens[j] +
        (dSkip[j] ? " \u2014 " + t("skippedTitle") : "");
    }
  }

  var api = {
    drawn: 0,
    rows: function () {
      var out = [];
      for (var i = 0; i < qRows.length; i++) {
        out.push({
          query_index: i, token: M.query_tokens[i], skipped: !!qSkip[i],
          document_index: qRows[i].dataset.match === undefined ? null : +qRows[i].dataset.match,
          score: qRows[i].dataset.score === undefined ? null : +qRows[i].dataset.score,
          shown: qRows[i].querySelector(".s").textContent,
        });
      }
      return out;
    },
    hover: function (i, side) { setFocus({ side: side || "query", i: i }); return api.drawn; },
    clear: function () { setFocus(null); return api.drawn; },
    focus: function () { return focus; },
    lang: lang,
  };
  var page = window.bertattn;
  if (page) {
    page.maxsim = api;
    var setLang = page.setLang;
    page.setLang = function (l) { var r = setLang(l); labels(); return r; };
  }
  $("lang").addEventListener("click", labels);  // after the page's own handler
  $("maxsim-view").hidden = false;
  labels();
  draw();
  heatmap();
})();
