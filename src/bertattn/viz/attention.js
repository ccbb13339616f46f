/* bertattn attention viewer: head view (lines between query and key tokens), model view
 * (every layer x head as a thumbnail) and steps view (one head's row recomputed from q, k, v,
 * step by step, as the article teaches it). No network; the data is the JSON in #bertattn-data:
 *   idx: base64 of uint16 little-endian key indices, val: base64 of uint8 weights (w*255),
 *     both laid out [layer][head][query][k], the k kept keys of each query sorted by weight;
 *   qkv (or null): for the model layer ids qkv.layers, base64 of float16 (or float32, see
 *     qkv.dtype) little-endian q, k, v laid out [3][head][token][d], and qkv.err: the error
 *     bounds of the recomputation, measured when the page was written (bertattn/viz/html.py);
 *   article: step name -> the article's own PyTorch lines (bertattn/viz/words.py);
 *   no_steps (or null): the step this model's attention has that the page cannot recompute;
 *   subword_note: {en, zh}: one line on the tokens' subword mark (##, ▁, Ġ), "" without one.
 * Every label is in STR below, in English and Chinese; the page starts in Chinese when the
 * browser's language is zh*, otherwise in English (or as #lang=zh / #lang=en says).
 * Test hook: window.bertattn (ready, firstPaintMs, lastDrawMs, setLayer, setHeads, hoverToken,
 * openSteps, closeSteps, steps, setLang, code, strings); the steps view also puts its numbers
 * on #steps-view as data-* attributes (weights, scores, scaled, context, stored, check, ...). */
(function () {
  "use strict";
  var T0 = performance.now();
  var D = JSON.parse(document.getElementById("bertattn-data").textContent);
  var N = D.n, K = D.k, H = D.heads, NL = D.layer_ids.length;
  var ROLL = D.rollout ? NL : -1;  // the rollout is the "layer" after the last one
  var ROW = 18, THUMB = Math.min(N, 48), BUCKETS = 16, LINE_BUDGET = 1500, TOP_KEYS = 12;

  // ---- every string of the page --------------------------------------------------------------
  var STR = {
    en: {
      langButton: "中文", langTitle: "切换到中文",
      titleModel: "{model}: attention", titlePlain: "bertattn attention",
      subtitle: "{n} tokens, {layers} layers × {heads} heads",
      subSegment: ", second segment from token {i}", subRollout: ", with attention rollout",
      subSteps: ", steps view for layer {list}",
      notePruned: "Stored: the top {k} of {n} keys per query (attention mass not drawn: mean " +
        "{mean}, max {max} of a row), weights quantized to 1/255 (error at most 1/510).",
      noteAll: "Stored: all {n} keys per query, weights quantized to 1/255 (error at most 1/510).",
      noteQkv: " q, k, v of layer {list} stored as {dtype} (max error {qkv}; the weights " +
        "recomputed from them are within {weights} of the model's).",
      noteNoQkv: " No q, k, v stored: no steps view (write the page with --steps LAYERS).",
      noteModelNoSteps: " No steps view for this model: the page recomputes " +
        "softmax(q·k/√d_k + mask) and has no step for {why}. The terminal shows its steps: " +
        "bertattn attend TEXT --explain LAYER:HEAD:TOKEN.",
      layerLabel: "Layer", layerOption: "Layer {id}", rolloutOption: "Rollout (all layers)",
      headsAria: "heads", headsAll: "all heads", headsNone: "none", threshold: "threshold",
      topk: "top-k per token", stepsButton: "Steps ▸",
      headView: "Head view",
      headHint: "Left: queries, right: keys. Hover a token to isolate its attention, click to " +
        "pin. Steps: with one head selected (click a thumbnail), click a query token to see " +
        "how its row is computed from q, k, v (or press “Steps ▸”).",
      caption: "layer {l}, heads {list}", captionAll: "all", captionNone: "none",
      captionRollout: "rollout",
      linesSome: "showing the {drawn} strongest of {total} lines between tokens in view " +
        "(weight ≥ {cut}); hover a token for all of its own",
      linesAll: "{total} lines between tokens in view",
      modelView: "Model view", modelCaption: "layers × heads, click one to open it",
      thumbTitle: "layer {l}, head {h}", thumbRollout: "rollout",
      stepsTitle: "Steps", close: "close", prevToken: "previous query token",
      nextToken: "next query token",
      stepsWhere: "layer {l}, head {h}, query {i} “{tok}”",
      headPick: "head:", keysShown: "keys shown:", keysTop: "the {k} heaviest",
      keysAll: "all {n}, in text order",
      pickHead: "{count} heads are selected in the head view; the steps are those of one head. " +
        "Pick one:",
      rolloutNoSteps: "The rollout multiplies all layers' weights; it has no q, k, v of its " +
        "own. Open a layer with steps:",
      layerNoSteps: "Layer {l} has no q, k, v in this page; steps are stored for layer {list}:",
      noSteps: "This page stores no q, k, v, so it cannot show the steps.",
      modelNoSteps: "This model has no steps view: the page recomputes softmax(q·k/√d_k + " +
        "mask) and has no step for {why}.",
      howExplain: "The terminal shows this model's steps, the rotation and the window " +
        "included where it has them: bertattn attend TEXT --explain LAYER:HEAD:TOKEN (e.g. " +
        "--explain 1:0:3).",
      howSteps: "To get them: bertattn attend TEXT --html page.html --steps LAYERS (e.g. " +
        "--steps 2), or in Python bert.attention_maps(text, qkv_layers=[2]), then save_html.",
      bounds: "The allowance {bound} is 1/510 (the head view stores each weight rounded to " +
        "1/255) + {werr} (q, k, v stored as {dtype}, measured when the page was written: " +
        "q/k/v {qkv}, q·k {scores}, ÷√d_k {scaled}, weights {weights}, context {context}).",
      boundsSummary: "where the allowance comes from",
      checkOk: "✓ The weights recomputed here from q, k and v are the model's: they differ " +
        "from the head view's by at most {diff}, within the {bound} that rounding the stored " +
        "numbers allows.",
      checkBad: "✗ The weights recomputed here from q, k and v are not the model's: they " +
        "differ from the head view's by up to {diff}, more than the {bound} that rounding the " +
        "stored numbers allows.",
      article: "article (PyTorch)", ours: "bertattn, {file} ({fn})",
      colKey: "key", colK: "kⱼ", colScore: "q·kⱼ", colScaled: "÷ √d_k",
      colWeight: "weight", colView: "head view", colWV: "weightⱼ · vⱼ",
      notKept: "not stored (below the top {k})",
      more: "… {m} more keys, weight {w} together",
      colorScale: "color: −{s} … +{s}", sumLabel: "Σ = context",
      s1: "① Project to Q, K, V",
      s1d: "The token's hidden vector x ({E} numbers) is multiplied by W_q, W_k and W_v (all " +
        "tokens at once: one matrix product). This head's q for “{tok}”: {D} numbers, " +
        "|q| = {norm}.",
      s2: "② Split into heads",
      s2d: "The {E} columns are cut into {H} heads of d_k = {D}; head {h} is columns {a}..{b}. " +
        "Each head attends on its own; every key's k and v in this head are {D} numbers too.",
      s3: "③ Scores: q · kⱼ",
      s3d: "One dot product of q with every key's k (strip: kⱼ).",
      s4: "④ Scale: ÷ √d_k",
      s4d: "√d_k = √{D} = {sq}: dividing by it keeps the scores' spread from growing " +
        "with d_k, so softmax does not saturate. (The article does ③ and ④ in one " +
        "line.)",
      s5: "⑤ Mask",
      s5d: "Nothing to mask here: this page holds one text (or pair), with no padding, so " +
        "all {n} keys keep bias 0. The mask matters in a batch: a shorter text is padded to " +
        "the longest, and each padding key gets −∞ (the article: −1e9), so weight 0.",
      s5v: "bias = 0 for every key ({n} of {n})",
      s6: "⑥ Softmax",
      s6d: "weightⱼ = exp(sⱼ − max s) / Σᵢ exp(sᵢ − max s): " +
        "positive, sum {sum}. Recomputed here from q and k; “head view” is the weight " +
        "stored for the head view.",
      s7: "⑦ Dropout",
      s7d: "Only while training: at inference, as here, p = 0 and the weights pass unchanged.",
      s8: "⑧ Weighted sum of V",
      s8d: "Every key's v times its weight (strips: weightⱼ · vⱼ); their sum is this " +
        "head's context for “{tok}”: {D} numbers, |context| = {norm}.",
      s9: "⑨ Merge heads → output projection",
      s9d: "The {H} heads' contexts are concatenated back into {E} numbers: this head's context " +
        "is columns h·d_k..(h+1)·d_k−1 = {a}..{b} of the concatenation fed to " +
        "W_o (output = W_o · concat + b_o). W_o is not stored in this page " +
        "(Python: Bert.attention_steps(...).output_share).",
      concat: "concatenation ({E}): head {h} = columns {a}..{b}",
      numbers: "numbers",
    },
    zh: {
      langButton: "English", langTitle: "Switch to English",
      titleModel: "{model}：注意力", titlePlain: "bertattn 注意力",
      subtitle: "{n} 个词元，{layers} 层 × {heads} 个头",
      subSegment: "，第二段从第 {i} 个词元开始", subRollout: "，含注意力 rollout",
      subSteps: "，第 {list} 层可看计算步骤",
      notePruned: "存储：每个查询只保留 {n} 个键中权重最大的 {k} 个（未画出的注意力质量：" +
        "平均 {mean}，最多 {max}），权重量化为 1/255（误差不超过 1/510）。",
      noteAll: "存储：每个查询的全部 {n} 个键，权重量化为 1/255（误差不超过 1/510）。",
      noteQkv: "第 {list} 层的 q、k、v 以 {dtype} 存储（最大误差 {qkv}；由它们重算的权重" +
        "与模型的相差不超过 {weights}）。",
      noteNoQkv: "未存 q、k、v：没有计算步骤视图（生成页面时加 --steps 层号）。",
      noteModelNoSteps: "本模型没有计算步骤视图：页面只能重算 softmax(q·k/√d_k + mask)，" +
        "没有“{why}”这一步。终端可以显示它的计算步骤：bertattn attend 文本 --explain 层:头:词元。",
      layerLabel: "层", layerOption: "第 {id} 层", rolloutOption: "Rollout（全部层）",
      headsAria: "注意力头", headsAll: "全部头", headsNone: "全不选", threshold: "阈值",
      topk: "每个词元前 k 条", stepsButton: "计算步骤 ▸",
      headView: "头视图",
      headHint: "左边是查询，右边是键。悬停在词元上只看它的注意力，点击固定。计算步骤：只选一个头" +
        "（点一个缩略图）时，点左边的查询词元，即可看这一行权重如何由 q、k、v 算出（也可点" +
        "“计算步骤 ▸”）。",
      caption: "第 {l} 层，头 {list}", captionAll: "全部", captionNone: "无",
      captionRollout: "rollout",
      linesSome: "显示可见词元之间 {total} 条线中最强的 {drawn} 条（权重 ≥ {cut}）；" +
        "悬停在词元上可看它的全部连线",
      linesAll: "可见词元之间共 {total} 条线",
      modelView: "模型视图", modelCaption: "层 × 头，点击一个在头视图中打开",
      thumbTitle: "第 {l} 层，头 {h}", thumbRollout: "rollout",
      stepsTitle: "计算步骤", close: "关闭", prevToken: "上一个查询词元",
      nextToken: "下一个查询词元",
      stepsWhere: "第 {l} 层，头 {h}，查询词元 {i}「{tok}」",
      headPick: "头：", keysShown: "显示的键：", keysTop: "权重最大的 {k} 个",
      keysAll: "全部 {n} 个，按原文顺序",
      pickHead: "头视图中选了 {count} 个头；计算步骤是单个头的，请选一个：",
      rolloutNoSteps: "rollout 把所有层的权重相乘，没有自己的 q、k、v。请打开一个有计算步骤的层：",
      layerNoSteps: "本页没有第 {l} 层的 q、k、v；有计算步骤的是第 {list} 层：",
      noSteps: "本页没有存 q、k、v，无法展示计算步骤。",
      modelNoSteps: "本模型没有计算步骤视图：页面只能重算 softmax(q·k/√d_k + mask)，" +
        "没有“{why}”这一步。",
      howExplain: "终端可以显示本模型的计算步骤（有旋转位置编码或局部窗口的，也一并显示）：" +
        "bertattn attend 文本 --explain 层:头:词元（如 --explain 1:0:3）。",
      howSteps: "生成含计算步骤的页面：bertattn attend 文本 --html page.html --steps 层号" +
        "（如 --steps 2），或在 Python 中 bert.attention_maps(text, qkv_layers=[2]) 后 save_html。",
      bounds: "允许的差 {bound} = 1/510（头视图把每个权重舍入到 1/255 存储）+ {werr}（q、k、v " +
        "以 {dtype} 存储，生成页面时测得：q/k/v {qkv}，q·k {scores}，÷√d_k {scaled}，" +
        "权重 {weights}，上下文 {context}）。",
      boundsSummary: "允许的差从何而来",
      checkOk: "✓ 重算的权重（本页由 q、k、v 算出）就是模型的权重：与头视图最多相差 {diff}，" +
        "在存储数值的舍入所允许的 {bound} 以内。",
      checkBad: "✗ 重算的权重（本页由 q、k、v 算出）不是模型的权重：与头视图相差 {diff}，" +
        "超过了存储数值的舍入所允许的 {bound}。",
      article: "文章（PyTorch）", ours: "bertattn，{file}（{fn}）",
      colKey: "键", colK: "kⱼ", colScore: "q·kⱼ", colScaled: "÷ √d_k",
      colWeight: "权重", colView: "头视图", colWV: "权重ⱼ · vⱼ",
      notKept: "未存（不在前 {k} 个中）",
      more: "…… 另有 {m} 个键，权重合计 {w}",
      colorScale: "颜色：−{s} … +{s}", sumLabel: "Σ = 上下文",
      s1: "① 线性投影：Q、K、V",
      s1d: "词元的隐藏向量 x（{E} 维）分别乘以 W_q、W_k、W_v（所有词元一起，一次矩阵乘法）。" +
        "「{tok}」在本头的 q：{D} 维，|q| = {norm}。",
      s2: "② 拆分多头",
      s2d: "{E} 列被切成 {H} 个头，每头 d_k = {D}：头 {h} 是第 {a}..{b} 列。各头独立计算" +
        "注意力；本头中每个键的 k 和 v 也是 {D} 维。",
      s3: "③ 打分：q · kⱼ",
      s3d: "q 与每个键的 k 做点积（色条：kⱼ）。",
      s4: "④ 缩放：÷ √d_k",
      s4d: "√d_k = √{D} = {sq}：除以它，分数的分散程度就不随 d_k 增大，softmax 不至于饱和。" +
        "（文章把 ③④ 写在同一行。）",
      s5: "⑤ 掩码",
      s5d: "这里没有要遮住的键：本页是一段文本（或一对文本），没有填充，全部 {n} 个键的偏置都是 0。" +
        "掩码在批处理中才起作用：较短的文本被填充到最长的长度，每个填充位置的键得到 −∞" +
        "（文章里是 −1e9），权重变为 0。",
      s5v: "偏置 = 0（{n} 个键全是）",
      s6: "⑥ Softmax 归一化",
      s6d: "权重ⱼ = exp(sⱼ − max s) / Σᵢ exp(sᵢ − max s)：全为正，总和 {sum}。此处由 q、k " +
        "重新计算；“头视图”列是为头视图存储的权重。",
      s7: "⑦ Dropout",
      s7d: "只在训练时生效；推理时（如本页）p = 0，权重原样通过。",
      s8: "⑧ 对 V 加权求和",
      s8d: "每个键的 v 乘以它的权重（色条：权重ⱼ · vⱼ）；它们的和就是本头为「{tok}」算出的" +
        "上下文向量：{D} 维，|context| = {norm}。",
      s9: "⑨ 合并多头 → 输出投影",
      s9d: "{H} 个头的上下文向量拼回 {E} 维：本头的上下文占拼接向量的第 h·d_k..(h+1)·d_k−1 = " +
        "{a}..{b} 列，再送入 W_o（output = W_o · concat + b_o）。本页未存 W_o（Python：" +
        "Bert.attention_steps(...).output_share）。",
      concat: "拼接向量（{E} 维）：头 {h} = 第 {a}..{b} 列",
      numbers: "数值",
    },
  };
  // The code of each step: the article's own PyTorch line(s), from the page's data
  // (bertattn/viz/words.py), and bertattn's (the file under src/bertattn/ and the function
  // they are in; tests check the lines are there verbatim).
  var OURS = {
    "attention/module.py": {
      project_qkv: {
        qkv: ["qkv = self._project(x, weight, bias)  # (B, L, 3E)"],
        split: ["qkv = qkv.view(b, lq, 3, h, d).permute(2, 0, 3, 1, 4)  # (3, B, H, L, D)"],
      },
      _merge_out: {
        merge: [
          "context = context.transpose(1, 2).reshape(b, lq, h * d)  # merge heads: (B, Lq, E)",
          "output = self.out_linear(context)  # (B, Lq, E)",
        ],
      },
    },
    "attention/backends.py": {
      math_attention: {
        scores: ["raw = torch.matmul(q, k.transpose(-2, -1)).to(score_dtype(q.dtype))"],
        scaled: ["scaled = raw / math.sqrt(d)"],
        mask: ["scores = scaled if bias is None else scaled + bias"],
        softmax: ["weights = torch.softmax(scores, dim=-1).to(q.dtype)  # (B, H, Lq, Lk)"],
        dropout: ["weights = F.dropout(weights, p=dropout_p, training=True)"],
        context: ["context = torch.matmul(weights, v)"],
      },
    },
  };
  // step name -> {article, file, fn, ours}
  var CODE = {};
  Object.keys(OURS).forEach(function (file) {
    Object.keys(OURS[file]).forEach(function (fn) {
      var steps = OURS[file][fn];
      Object.keys(steps).forEach(function (name) {
        CODE[name] = { article: D.article[name], file: file, fn: fn, ours: steps[name] };
      });
    });
  });

  function pickLang() {
    var m = /(?:^#|[#&])lang=(zh|en)\b/.exec(location.hash);
    if (m) return m[1];
    var nav = (navigator.languages && navigator.languages[0]) || navigator.language || "en";
    return /^zh\b/i.test(nav) ? "zh" : "en";
  }
  var lang = pickLang();
  function t(key, p) {
    var s = STR[lang][key];
    if (s === undefined) s = STR.en[key];
    if (s === undefined) throw new Error("no string " + key);
    return s.replace(/\{(\w+)\}/g, function (m, name) {
      return p && Object.prototype.hasOwnProperty.call(p, name) ? String(p[name]) : m;
    });
  }
  function pct(x) { return (100 * x).toFixed(1) + "%"; }
  function num(x) { return +x.toPrecision(2) === 0 ? "0" : String(+x.toPrecision(2)); }
  function fix(x, d) { return (x < 0 ? "\u2212" : "") + Math.abs(x).toFixed(d); }
  function list(ids) { return ids.join(", "); }

  // ---- data ----------------------------------------------------------------------------------
  function bytes(s) {
    var bin = atob(s), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  var LITTLE = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
  function u16(s) {
    var b = bytes(s);
    if (LITTLE) return new Uint16Array(b.buffer, 0, b.length >> 1);
    var out = new Uint16Array(b.length >> 1);
    for (var i = 0; i < out.length; i++) out[i] = b[2 * i] | (b[2 * i + 1] << 8);
    return out;
  }
  var IDX = u16(D.idx), VAL = bytes(D.val);
  var R = D.rollout ? { idx: u16(D.rollout.idx), val: bytes(D.rollout.val) } : null;
  var decodeMs = performance.now() - T0;

  // q, k, v: decoded only when the steps view first needs a layer
  var QKV = D.qkv, DH = QKV ? QKV.d : 0, E = H * DH;
  var qkvPos = {};  // layer position -> index into QKV.layers / data / err
  var qkvIds = QKV ? QKV.layers : [];
  qkvIds.forEach(function (id, j) { qkvPos[D.layer_ids.indexOf(id)] = j; });
  var qkvCache = {}, F16 = null;
  function f16Table() {
    if (F16) return F16;
    F16 = new Float32Array(65536);
    for (var h = 0; h < 65536; h++) {
      var e = (h >> 10) & 31, m = h & 1023, v;
      if (e === 0) v = m * Math.pow(2, -24);
      else if (e === 31) v = m ? NaN : Infinity;
      else v = (1 + m / 1024) * Math.pow(2, e - 15);
      F16[h] = h & 0x8000 ? -v : v;
    }
    return F16;
  }
  function qkvOf(pos) {
    var j = qkvPos[pos];
    if (j === undefined) return null;
    if (!qkvCache[j]) {
      var out;
      if (QKV.dtype[j] === "f16") {
        var half = u16(QKV.data[j]), tab = f16Table();
        out = new Float32Array(half.length);
        for (var i = 0; i < half.length; i++) out[i] = tab[half[i]];
      } else {
        var b = bytes(QKV.data[j]), dv = new DataView(b.buffer);
        out = new Float32Array(b.length >> 2);
        for (var i2 = 0; i2 < out.length; i2++) out[i2] = dv.getFloat32(4 * i2, true);
      }
      qkvCache[j] = out;
    }
    return qkvCache[j];
  }
  function dtypeName(pos) {
    var j = qkvPos[pos];
    return j !== undefined && QKV.dtype[j] === "f32" ? "float32" : "float16";
  }

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

  var init = D.initial || {};
  var state = {
    layer: init.layer == null ? 0 : init.layer, heads: [], threshold: 0.02,
    topk: Math.min(K, 8), focus: null, pinned: null, lang: lang,
    steps: { open: false, query: 0, keys: N <= 40 ? "all" : "top" },
  };
  for (var h0 = 0; h0 < H; h0++) state.heads.push(init.head == null || init.head === h0);

  // ---- DOM -----------------------------------------------------------------------------------
  var $ = function (id) { return document.getElementById(id); };
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }
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

  function tokenColumn(box, side) {
    var frag = document.createDocumentFragment();
    for (var i = 0; i < N; i++) {
      var s = document.createElement("span");
      s.className = "token" + (D.segment_start === i ? " seg-start" : "");
      s.textContent = D.tokens[i];
      s.title = i + ": " + D.tokens[i];
      s.dataset.i = i; s.dataset.side = side;
      frag.appendChild(s);
    }
    box.appendChild(frag);
    box.addEventListener("mouseover", function (e) {
      var tk = e.target.closest(".token");
      if (tk && !state.pinned) setFocus({ side: side, i: +tk.dataset.i });
    });
    box.addEventListener("mouseleave", function () { if (!state.pinned) setFocus(null); });
    box.addEventListener("click", function (e) {
      var tk = e.target.closest(".token");
      if (!tk) return;
      var f = { side: side, i: +tk.dataset.i };
      var same = state.pinned && state.pinned.side === f.side && state.pinned.i === f.i;
      state.pinned = same ? null : f;
      setFocus(f);
      // a query token opens its steps when one head is selected (or the steps view is open)
      if (side === "left" && (state.steps.open ||
          (state.layer !== ROLL && visibleHeads().length === 1))) openSteps(f.i);
    });
  }
  tokenColumn($("tokens-left"), "left");
  tokenColumn($("tokens-right"), "right");
  var spans = { left: $("tokens-left").children, right: $("tokens-right").children };

  var sel = $("layer");
  D.layer_ids.forEach(function (id, i) { sel.add(new Option("", String(i))); });
  if (R) sel.add(new Option("", String(ROLL)));
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
    syncControls(); draw(); renderSteps();
  });
  $("heads-all").addEventListener("click", function () { setHeads(null); });
  $("heads-none").addEventListener("click", function () { setHeads([]); });

  var thr = $("threshold"), topk = $("topk");
  thr.value = state.threshold; topk.max = K; topk.value = state.topk;
  thr.addEventListener("input", function () { state.threshold = +thr.value; syncControls(); draw(); });
  topk.addEventListener("input", function () { state.topk = +topk.value; syncControls(); draw(); });

  $("lang").addEventListener("click", function () { setLang(lang === "en" ? "zh" : "en"); });
  $("steps-open").addEventListener("click", function () {
    if (state.steps.open) { closeSteps(); return; }
    var p = state.pinned;
    openSteps(p && p.side === "left" ? p.i : state.steps.query);
  });
  $("steps-close").addEventListener("click", function () { closeSteps(); });
  $("steps-prev").addEventListener("click", function () { stepQuery(-1); });
  $("steps-next").addEventListener("click", function () { stepQuery(1); });

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
    var hs = visibleHeads();
    $("head-view-caption").textContent = state.layer === ROLL ? t("captionRollout")
      : t("caption", {
        l: D.layer_ids[state.layer],
        list: hs.length === H ? t("captionAll") : hs.length ? hs.join(", ") : t("captionNone"),
      });
    var th = document.querySelectorAll(".thumbs canvas");
    for (var j = 0; j < th.length; j++) {
      var l = +th[j].dataset.layer, hh = +th[j].dataset.head;
      th[j].classList.toggle("selected", l === state.layer &&
        (l === ROLL || (hs.length === 1 && hs[0] === hh)));
    }
    var btn = $("steps-open");
    btn.classList.toggle("on", state.steps.open);
    btn.setAttribute("aria-pressed", state.steps.open ? "true" : "false");
  }

  // ---- language ------------------------------------------------------------------------------
  function applyLang() {
    document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
    var nodes = document.querySelectorAll("[data-i18n]");
    for (var i = 0; i < nodes.length; i++) nodes[i].textContent = t(nodes[i].dataset.i18n);
    nodes = document.querySelectorAll("[data-i18n-title]");
    for (var j = 0; j < nodes.length; j++) nodes[j].title = t(nodes[j].dataset.i18nTitle);
    nodes = document.querySelectorAll("[data-i18n-aria]");
    for (var a = 0; a < nodes.length; a++) {
      nodes[a].setAttribute("aria-label", t(nodes[a].dataset.i18nAria));
    }
    var b = $("lang");
    b.textContent = t("langButton"); b.title = t("langTitle");
    if (D.title == null) {
      var title = D.model_name ? t("titleModel", { model: D.model_name }) : t("titlePlain");
      $("title").textContent = title; document.title = title;
    }
    var sub = t("subtitle", { n: N, layers: NL, heads: H });
    if (D.segment_start) sub += t("subSegment", { i: D.segment_start });
    if (R) sub += t("subRollout");
    if (qkvIds.length) sub += t("subSteps", { list: list(qkvIds) });
    $("subtitle").textContent = sub;
    var note = K < N
      ? t("notePruned", { k: K, n: N, mean: pct(D.dropped_mean), max: pct(D.dropped_max) })
      : t("noteAll", { n: N });
    if (QKV) {
      var worst = { qkv: 0, weights: 0 }, f32 = false;
      QKV.err.forEach(function (e, j) {
        worst.qkv = Math.max(worst.qkv, e.qkv); worst.weights = Math.max(worst.weights, e.weights);
        f32 = f32 || QKV.dtype[j] === "f32";
      });
      note += t("noteQkv", {
        list: list(qkvIds), dtype: f32 ? "float16/float32" : "float16",
        qkv: num(worst.qkv), weights: num(worst.weights),
      });
    } else {
      note += D.no_steps ? t("noteModelNoSteps", { why: D.no_steps }) : t("noteNoQkv");
    }
    $("note").textContent = note;
    var marks = D.subword_note && D.subword_note[lang];  // what ##, ▁ or Ġ in the tokens mean
    $("subword-note").hidden = !marks;
    $("subword-note").textContent = marks || "";
    for (var o = 0; o < sel.options.length; o++) {
      var v = +sel.options[o].value;
      sel.options[o].text = v === ROLL ? t("rolloutOption") : t("layerOption", { id: D.layer_ids[v] });
    }
    var th = document.querySelectorAll(".thumbs canvas");
    for (var c = 0; c < th.length; c++) {
      var l = +th[c].dataset.layer;
      th[c].title = l === ROLL ? t("thumbRollout")
        : t("thumbTitle", { l: D.layer_ids[l], h: th[c].dataset.head });
    }
  }
  function setLang(l) {
    if (!STR[l]) throw new RangeError("language " + l);
    lang = l; state.lang = l;
    applyLang(); syncControls(); draw(); renderSteps();
    return lang;
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
    var t0 = performance.now();
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
    var li = $("lines-info");
    li.textContent = li.title = info
      ? (info.drawn < info.total
        ? t("linesSome", { drawn: info.drawn, total: info.total, cut: (info.cut / 255).toFixed(3) })
        : t("linesAll", { total: info.total }))
      : "";
    api.lastDrawMs = performance.now() - t0;
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
    state.layer = i; syncControls();
    var ms = draw();
    renderSteps();
    return ms;
  }
  function setHeads(lst) {
    for (var h = 0; h < H; h++) state.heads[h] = lst === null || lst.indexOf(h) >= 0;
    syncControls();
    var ms = draw();
    renderSteps();
    return ms;
  }

  // ---- steps view ----------------------------------------------------------------------------
  // One head's row recomputed here, in float64, from the stored q, k, v: q·k, ÷√d_k, (mask: 0),
  // softmax, weights·v and their sum; then checked against the head view's stored row.
  function computeSteps(pos, h, i) {
    var a = qkvOf(pos), dd = DH, sq = Math.sqrt(dd), j, d;
    function at(which, tok) { return ((which * H + h) * N + tok) * dd; }
    var q = new Float64Array(dd), qb = at(0, i);
    for (d = 0; d < dd; d++) q[d] = a[qb + d];
    var scores = new Float64Array(N), scaled = new Float64Array(N), mx = -Infinity;
    for (j = 0; j < N; j++) {
      var s = 0, kb = at(1, j);
      for (d = 0; d < dd; d++) s += q[d] * a[kb + d];
      scores[j] = s; scaled[j] = s / sq;  // + the mask bias, 0 for every key here
      if (scaled[j] > mx) mx = scaled[j];
    }
    var weights = new Float64Array(N), total = 0;
    for (j = 0; j < N; j++) { weights[j] = Math.exp(scaled[j] - mx); total += weights[j]; }
    var context = new Float64Array(dd), wsum = 0;
    for (j = 0; j < N; j++) {
      weights[j] /= total; wsum += weights[j];
      var vb = at(2, j);
      for (d = 0; d < dd; d++) context[d] += weights[j] * a[vb + d];
    }
    // the head view's stored row: the top K keys, round(w * 255); the others are at most the
    // smallest kept one
    var b = block(pos, h), off = b.off + i * K, stored = [], kept = new Uint8Array(N);
    for (j = 0; j < N; j++) stored.push(null);
    var diff = 0, least = 1;
    for (var r = 0; r < K; r++) {
      var jj = b.idx[off + r], sv = b.val[off + r] / 255;
      stored[jj] = sv; kept[jj] = 1;
      diff = Math.max(diff, Math.abs(weights[jj] - sv)); least = Math.min(least, sv);
    }
    if (K < N) for (j = 0; j < N; j++) if (!kept[j]) diff = Math.max(diff, weights[j] - least);
    var err = QKV.err[qkvPos[pos]], bound = 1 / 510 + err.weights + 1e-9;
    return {
      layer: D.layer_ids[pos], pos: pos, head: h, query: i, d: dd, sqrt_d: sq,
      q: q, k: function (tok) { return a.subarray(at(1, tok), at(1, tok) + dd); },
      v: function (tok) { return a.subarray(at(2, tok), at(2, tok) + dd); },
      scores: scores, scaled: scaled, weights: weights, weight_sum: wsum, context: context,
      stored: stored, max_diff: diff, bound: bound, ok: diff <= bound, err: err,
      dtype: dtypeName(pos),
    };
  }

  var lastSteps = null;
  function openSteps(i) {
    if (!(i >= 0 && i < N)) throw new RangeError("query token " + i);
    var was = state.steps.open;
    state.steps.open = true; state.steps.query = i;
    $("steps-view").hidden = false;
    syncControls(); renderSteps();
    if (!was) {  // narrow windows put the steps below the head view: bring its top into view
      fitSteps();
      var top = $("steps-view").getBoundingClientRect().top;
      if (top < 0 || top > window.innerHeight - 120) $("steps-view").scrollIntoView({ block: "start" });
    }
    return lastSteps ? plain(lastSteps) : null;
  }
  // the steps view scrolls inside itself, as tall as the window below the sticky controls
  function fitSteps() {
    var bar = $("controls").offsetHeight, view = $("steps-view");
    view.style.maxHeight = Math.max(240, window.innerHeight - bar - 16) + "px";
    view.style.scrollMarginTop = bar + 8 + "px";
  }
  window.addEventListener("resize", function () { if (state.steps.open) fitSteps(); });
  function closeSteps() {
    state.steps.open = false;
    $("steps-view").hidden = true;
    syncControls(); renderSteps();
  }
  function stepQuery(delta) {
    var i = Math.max(0, Math.min(N - 1, state.steps.query + delta));
    state.pinned = { side: "left", i: i };
    setFocus(state.pinned);
    spans.left[i].scrollIntoView({ block: "nearest" });
    openSteps(i);
  }

  // a heat strip of values[from .. from + n), color scale ±scale, one cell per value
  function strip(values, from, n, scale, cls) {
    var cv = el("canvas", "strip" + (cls ? " " + cls : ""));
    cv.width = n; cv.height = 1;
    var g = cv.getContext("2d"), img = g.createImageData(n, 1), px = img.data, tip = [];
    for (var x = 0; x < n; x++) {
      var v = values[from + x], s = scale > 0 ? Math.max(-1, Math.min(1, v / scale)) : 0;
      var c = s >= 0 ? [178, 24, 43] : [33, 102, 172], m = Math.abs(s);
      px[4 * x] = 255 + (c[0] - 255) * m; px[4 * x + 1] = 255 + (c[1] - 255) * m;
      px[4 * x + 2] = 255 + (c[2] - 255) * m; px[4 * x + 3] = 255;
      tip.push(v.toFixed(3));
    }
    g.putImageData(img, 0, 0);
    cv.title = tip.join(" ");
    return cv;
  }
  // the concatenation of all heads (E cells), grey but for head h's slot, which shows values
  function concatStrip(values, h, scale) {
    var n = E, cv = el("canvas", "strip concat");
    cv.width = n; cv.height = 1;
    var g = cv.getContext("2d"), img = g.createImageData(n, 1), px = img.data;
    for (var x = 0; x < n; x++) {
      var hh = Math.floor(x / DH), c;
      if (hh === h) {
        var s = Math.max(-1, Math.min(1, values[x - h * DH] / scale)), m = Math.abs(s);
        var base = s >= 0 ? [178, 24, 43] : [33, 102, 172];
        c = [255 + (base[0] - 255) * m, 255 + (base[1] - 255) * m, 255 + (base[2] - 255) * m];
      } else {
        c = hh % 2 ? [208, 213, 221] : [234, 236, 240];
      }
      px[4 * x] = c[0]; px[4 * x + 1] = c[1]; px[4 * x + 2] = c[2]; px[4 * x + 3] = 255;
    }
    g.putImageData(img, 0, 0);
    return cv;
  }
  function bar(value, scale, signed) {
    var wrap = el("span", "bar" + (signed ? " signed" : "")), fill = el("span", "fill");
    var f = scale > 0 ? Math.min(1, Math.abs(value) / scale) : 0;
    if (value < 0) fill.classList.add("neg");
    if (signed) {
      fill.style.left = (value < 0 ? 50 - 50 * f : 50) + "%";
      fill.style.width = 50 * f + "%";
    } else {
      fill.style.left = "0"; fill.style.width = 100 * f + "%";
    }
    wrap.appendChild(fill);
    return wrap;
  }
  function maxAbs(arr, n) {
    var m = 0;
    for (var i = 0; i < (n == null ? arr.length : n); i++) m = Math.max(m, Math.abs(arr[i]));
    return m;
  }
  function norm(arr) {
    var s = 0;
    for (var i = 0; i < arr.length; i++) s += arr[i] * arr[i];
    return Math.sqrt(s).toFixed(3);
  }
  function codeBlock(name) {
    var c = CODE[name], box = el("div", "code");
    box.appendChild(el("span", "src", t("article")));
    box.appendChild(el("pre", "article", c.article.join("\n")));
    box.appendChild(el("span", "src", t("ours", { file: c.file, fn: c.fn })));
    box.appendChild(el("pre", "ours", c.ours.join("\n")));
    return box;
  }
  function card(name, title, desc) {
    var box = el("div", "step");
    box.dataset.step = name;
    box.appendChild(el("h3", null, title));
    if (desc) box.appendChild(el("p", "desc", desc));
    box.appendChild(codeBlock(name));
    return box;
  }
  function numbersBox(values) {
    var det = el("details", "numbers"), parts = [];
    det.appendChild(el("summary", null, t("numbers")));
    for (var i = 0; i < values.length; i++) parts.push(fix(values[i], 3));
    det.appendChild(el("pre", null, parts.join(" ")));
    return det;
  }
  function tokenCell(j, query) {
    var td = el("td", "tok" + (j === query ? " self" : ""), D.tokens[j]);
    td.title = j + ": " + D.tokens[j];
    return td;
  }
  // key rows of one step: head cells, then cells(j) -> list of cells for key j
  function keyTable(st, heads, cells, order) {
    var tb = el("table", "keys"), tr = el("tr");
    tr.appendChild(el("th", "idx", "#"));
    heads.forEach(function (hd) { tr.appendChild(el("th", null, hd)); });
    tb.appendChild(tr);
    order.forEach(function (j) {
      var row = el("tr");
      row.dataset.j = j;
      row.appendChild(el("td", "idx", String(j)));
      row.appendChild(tokenCell(j, st.query));
      cells(j).forEach(function (c) { row.appendChild(c); });
      tb.appendChild(row);
    });
    if (order.length < N) {
      var rest = 0;
      for (var j = 0; j < N; j++) rest += st.weights[j];
      order.forEach(function (jj) { rest -= st.weights[jj]; });
      var more = el("tr", "more"), td = el("td", null,
        t("more", { m: N - order.length, w: Math.max(0, rest).toFixed(4) }));
      td.colSpan = heads.length + 1;
      more.appendChild(td);
      tb.appendChild(more);
    }
    return tb;
  }
  function numCell(x, d) { return el("td", "num", fix(x, d)); }
  function barCell(x, scale, signed) { var td = el("td", "barcell"); td.appendChild(bar(x, scale, signed)); return td; }
  function stripCell(values, from, n, scale) {
    var td = el("td", "stripcell"); td.appendChild(strip(values, from, n, scale)); return td;
  }

  function setStepsData(view, st) {
    var keys = ["layer", "head", "query", "weights", "scores", "scaled", "context", "stored",
      "check", "max-diff", "bound", "err"];
    keys.forEach(function (k) { view.removeAttribute("data-" + k); });
    if (!st) return;
    var ds = view.dataset;
    ds.layer = st.layer; ds.head = st.head; ds.query = st.query;
    ds.weights = JSON.stringify(Array.from(st.weights));
    ds.scores = JSON.stringify(Array.from(st.scores));
    ds.scaled = JSON.stringify(Array.from(st.scaled));
    ds.context = JSON.stringify(Array.from(st.context));
    ds.stored = JSON.stringify(st.stored);
    ds.check = st.ok ? "pass" : "fail";
    ds.maxDiff = st.max_diff; ds.bound = st.bound; ds.err = JSON.stringify(st.err);
  }
  function plain(st) {
    return {
      layer: st.layer, head: st.head, query: st.query, d: st.d, sqrt_d: st.sqrt_d,
      q: Array.from(st.q), scores: Array.from(st.scores), scaled: Array.from(st.scaled),
      weights: Array.from(st.weights), context: Array.from(st.context), stored: st.stored,
      max_diff: st.max_diff, bound: st.bound, ok: st.ok, err: st.err,
    };
  }

  function layerButtons(box) {
    var row = el("div", "picker");
    qkvIds.forEach(function (id) {
      var b = el("button", null, t("layerOption", { id: id }));
      b.type = "button"; b.dataset.layer = id;
      b.addEventListener("click", function () { setLayer(D.layer_ids.indexOf(id)); });
      row.appendChild(b);
    });
    box.appendChild(row);
  }
  function headButtons(box, current) {
    var row = el("div", "picker");
    row.appendChild(el("span", "lab", t("headPick")));
    for (var h = 0; h < H; h++) {
      var b = el("button", "head-btn" + (h === current ? " on" : ""), "H" + h);
      b.type = "button"; b.dataset.head = h;
      b.style.borderColor = headColor(h);
      if (h === current) { b.style.background = headColor(h); b.style.color = "#fff"; }
      b.addEventListener("click", function (e) { setHeads([+e.target.dataset.head]); });
      row.appendChild(b);
    }
    box.appendChild(row);
  }

  function renderSteps() {
    var view = $("steps-view"), body = $("steps-body");
    if (!state.steps.open) {
      view.dataset.state = "closed"; setStepsData(view, null); lastSteps = null;
      return;
    }
    var t0 = performance.now();
    body.textContent = "";
    var i = state.steps.query, hs = visibleHeads(), pos = state.layer, st = null;
    var where = $("steps-where");
    where.textContent = "";
    var stateName;
    if (!QKV && D.no_steps) {  // the model's attention has a step the page cannot redo
      stateName = "model";
      body.appendChild(el("p", "msg", t("modelNoSteps", { why: D.no_steps })));
      body.appendChild(el("p", "how", t("howExplain")));
    } else if (!QKV) {
      stateName = "none";
      body.appendChild(el("p", "msg", t("noSteps")));
      body.appendChild(el("p", "how", t("howSteps")));
    } else if (pos === ROLL) {
      stateName = "rollout";
      body.appendChild(el("p", "msg", t("rolloutNoSteps")));
      layerButtons(body);
    } else if (qkvPos[pos] === undefined) {
      stateName = "no-layer";
      body.appendChild(el("p", "msg",
        t("layerNoSteps", { l: D.layer_ids[pos], list: list(qkvIds) })));
      layerButtons(body);
      body.appendChild(el("p", "how", t("howSteps")));
    } else if (hs.length !== 1) {
      stateName = "pick-head";
      body.appendChild(el("p", "msg", t("pickHead", { count: hs.length })));
      headButtons(body, -1);
    } else {
      stateName = "ok";
      st = computeSteps(pos, hs[0], i);
      where.textContent = t("stepsWhere", { l: st.layer, h: st.head, i: i, tok: D.tokens[i] });
      buildSteps(body, st);
    }
    view.dataset.state = stateName;
    lastSteps = st;
    setStepsData(view, st);
    api.lastStepsMs = performance.now() - t0;
  }

  function buildSteps(body, st) {
    var i = st.query, h = st.head, dd = st.d, j, d;
    var top = el("div", "steps-top");
    headButtons(top, h);
    var keysRow = el("label", "keys-mode");
    keysRow.appendChild(el("span", "lab", t("keysShown")));
    var ks = el("select");
    ks.id = "steps-keys";
    ks.add(new Option(t("keysTop", { k: Math.min(TOP_KEYS, N) }), "top"));
    ks.add(new Option(t("keysAll", { n: N }), "all"));
    ks.value = state.steps.keys;
    ks.addEventListener("change", function () { state.steps.keys = ks.value; renderSteps(); });
    keysRow.appendChild(ks);
    top.appendChild(keysRow);
    body.appendChild(top);
    // the bound rounded up, so a shown difference never looks larger than a passing bound
    var bound = (Math.ceil(st.bound * 1e4) / 1e4).toFixed(4);
    var check = el("p", "check " + (st.ok ? "ok" : "bad"), t(st.ok ? "checkOk" : "checkBad", {
      diff: st.max_diff.toFixed(4), bound: bound,
    }));
    check.id = "steps-check";  // shown once, in the softmax step beside the head view's column
    var why = el("details", "bounds");  // the check's arithmetic, on demand
    why.appendChild(el("summary", null, t("boundsSummary")));
    why.appendChild(el("p", null, t("bounds", {
      bound: bound, werr: num(st.err.weights), dtype: st.dtype, qkv: num(st.err.qkv),
      scores: num(st.err.scores), scaled: num(st.err.scaled), weights: num(st.err.weights),
      context: num(st.err.context),
    })));

    var order = [];
    for (j = 0; j < N; j++) order.push(j);
    if (state.steps.keys === "top" && N > TOP_KEYS) {
      order.sort(function (x, y) { return st.weights[y] - st.weights[x] || x - y; });
      order = order.slice(0, TOP_KEYS);
    }
    var grid = el("div", "steps");
    var qk = Math.max(maxAbs(st.q), 1e-12), kAbs = qk;
    for (j = 0; j < N; j++) kAbs = Math.max(kAbs, maxAbs(st.k(j)));
    var a = h * dd, b = (h + 1) * dd - 1, tok = D.tokens[i];

    // 1: q, k, v
    var c1 = card("qkv", t("s1"), t("s1d", { E: E, tok: tok, D: dd, norm: norm(st.q) }));
    var qrow = el("div", "vec");
    qrow.appendChild(el("span", "lab", "q"));
    qrow.appendChild(strip(st.q, 0, dd, kAbs, "wide"));
    qrow.appendChild(el("span", "scale", t("colorScale", { s: kAbs.toFixed(2) })));
    c1.appendChild(qrow);
    c1.appendChild(numbersBox(st.q));
    grid.appendChild(c1);
    // 2: split heads
    var c2 = card("split", t("s2"), t("s2d", { E: E, H: H, D: dd, h: h, a: a, b: b }));
    var row2 = el("div", "vec");
    row2.appendChild(el("span", "lab", "q"));
    row2.appendChild(concatStrip(st.q, h, kAbs));
    c2.appendChild(row2);
    c2.appendChild(el("p", "caption", t("concat", { E: E, h: h, a: a, b: b })));
    grid.appendChild(c2);
    // 3: scores
    var signed = false, sAbs = 0;
    for (j = 0; j < N; j++) { if (st.scores[j] < 0) signed = true; sAbs = Math.max(sAbs, Math.abs(st.scores[j])); }
    var c3 = card("scores", t("s3"), t("s3d"));
    c3.appendChild(keyTable(st, [t("colKey"), t("colK"), t("colScore"), ""], function (jj) {
      var kv = st.k(jj);
      return [stripCell(kv, 0, dd, kAbs), barCell(st.scores[jj], sAbs, signed),
        numCell(st.scores[jj], 3)];
    }, order));
    grid.appendChild(c3);
    // 4: scaled
    var c4 = card("scaled", t("s4"), t("s4d", { D: dd, sq: st.sqrt_d.toFixed(3) }));
    c4.appendChild(keyTable(st, [t("colKey"), t("colScaled"), ""], function (jj) {
      return [barCell(st.scaled[jj], sAbs / st.sqrt_d, signed), numCell(st.scaled[jj], 3)];
    }, order));
    grid.appendChild(c4);
    // 5: mask
    var c5 = card("mask", t("s5"), t("s5d", { n: N }));
    c5.appendChild(el("p", "chip", t("s5v", { n: N })));
    grid.appendChild(c5);
    // 6: softmax
    var wMax = maxAbs(st.weights);
    var c6 = card("softmax", t("s6"), t("s6d", { sum: st.weight_sum.toFixed(4) }));
    c6.appendChild(check);
    c6.appendChild(why);
    c6.appendChild(keyTable(st, [t("colKey"), t("colWeight"), "", t("colView")], function (jj) {
      var sv = st.stored[jj], view = el("td", "num view", sv == null ? "\u2014" : sv.toFixed(4));
      if (sv == null) view.title = t("notKept", { k: K });
      return [barCell(st.weights[jj], wMax, false), numCell(st.weights[jj], 4), view];
    }, order));
    grid.appendChild(c6);
    // 7: dropout
    grid.appendChild(card("dropout", t("s7"), t("s7d")));
    // 8: weighted sum of v
    var wvAbs = 1e-12;
    for (j = 0; j < N; j++) {
      var vv = st.v(j);
      for (d = 0; d < dd; d++) wvAbs = Math.max(wvAbs, Math.abs(st.weights[j] * vv[d]));
    }
    var cAbs = Math.max(maxAbs(st.context), 1e-12);
    var c8 = card("context", t("s8"), t("s8d", { tok: tok, D: dd, norm: norm(st.context) }));
    var tb8 = keyTable(st, [t("colKey"), t("colWeight"), t("colWV")], function (jj) {
      var vv2 = st.v(jj), wv = new Float64Array(dd);
      for (var x = 0; x < dd; x++) wv[x] = st.weights[jj] * vv2[x];
      return [numCell(st.weights[jj], 4), stripCell(wv, 0, dd, wvAbs)];
    }, order);
    var sum = el("tr", "sum");
    sum.appendChild(el("td", "idx"));
    sum.appendChild(el("td", "tok", t("sumLabel")));
    sum.appendChild(el("td", "num", fix(st.weight_sum, 4)));
    sum.appendChild(stripCell(st.context, 0, dd, cAbs));
    tb8.appendChild(sum);
    c8.appendChild(tb8);
    c8.appendChild(el("p", "scale", t("colWV") + " \u2014 " + t("colorScale", { s: wvAbs.toFixed(3) }) +
      "; " + t("sumLabel") + " \u2014 " + t("colorScale", { s: cAbs.toFixed(3) })));
    c8.appendChild(numbersBox(st.context));
    grid.appendChild(c8);
    // 9: merge heads, output projection
    var c9 = card("merge", t("s9"), t("s9d", { H: H, E: E, a: a, b: b }));
    var row9 = el("div", "vec");
    row9.appendChild(el("span", "lab", "concat"));
    row9.appendChild(concatStrip(st.context, h, cAbs));
    c9.appendChild(row9);
    c9.appendChild(el("p", "caption", t("concat", { E: E, h: h, a: a, b: b })));
    grid.appendChild(c9);
    body.appendChild(grid);
  }
  // hovering a key row highlights that key in every step
  $("steps-body").addEventListener("mouseover", function (e) {
    var row = e.target.closest && e.target.closest("tr[data-j]");
    var old = $("steps-body").querySelectorAll("tr.hl");
    for (var i = 0; i < old.length; i++) old[i].classList.remove("hl");
    if (!row) return;
    var same = $("steps-body").querySelectorAll('tr[data-j="' + row.dataset.j + '"]');
    for (var j = 0; j < same.length; j++) same[j].classList.add("hl");
  });

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
      lab.className = "lab" + (qkvPos[l] !== undefined ? " has-steps" : "");
      lab.textContent = pair[1];
      box.appendChild(lab);
      var n = l === ROLL ? 1 : H;
      for (var h = 0; h < n; h++) {
        var cv = document.createElement("canvas");
        cv.dataset.layer = l; cv.dataset.head = h;
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
    syncControls(); draw(); renderSteps();
    $("head-view").scrollIntoView({ block: "nearest" });
  }

  var api = {
    ready: false, firstPaintMs: null, decodeMs: decodeMs, lastDrawMs: null, drawCount: 0,
    lastStepsMs: null, layers: NL, heads: H, tokens: N, hasRollout: !!R, code: CODE, strings: STR,
    state: function () { return JSON.parse(JSON.stringify(state)); },
    setLayer: setLayer, setHeads: setHeads, setLang: setLang,
    openSteps: openSteps, closeSteps: closeSteps,
    steps: function () { return lastSteps ? plain(lastSteps) : null; },
    setLineBudget: function (n) { LINE_BUDGET = n; return draw(); },
    hoverToken: function (i, side) { setFocus({ side: side || "left", i: i }); return api.lastDrawMs; },
    clearHover: function () { state.pinned = null; return setFocus(null); },
  };
  window.bertattn = api;

  sizeCanvas();
  applyLang();
  syncControls();
  draw();
  buildThumbs();
  applyLang();
  syncControls();
  api.firstPaintMs = performance.now();
  api.ready = true;
})();
