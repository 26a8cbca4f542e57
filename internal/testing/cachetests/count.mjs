// Counts the suite's results: each test on its own (a failed required test —
// kind "required" or none — is a failure whether or not the tests it depends
// on passed), and as cache-tests.fyi shows them (a test whose dependency did
// not pass is a dependency failure instead).
// Usage: node count.mjs <suite dir> <results.json>
import fs from 'fs'
import path from 'path'
import { pathToFileURL } from 'url'

const [suite, resultsFile] = process.argv.slice(2)
const imp = p => import(pathToFileURL(path.join(suite, p)).href)
const tests = (await imp('tests/index.mjs')).default
const { determineTestResult, resultTypes } = await imp('test-engine/lib/results.mjs')
const results = JSON.parse(fs.readFileSync(resultsFile, 'utf8'))

const names = new Map(Object.entries(resultTypes).map(([k, v]) => [v, k]))
const counts = {}
const fyi = {}
const failed = []
for (const s of tests) {
  for (const t of s.tests) {
    const r = names.get(determineTestResult(tests, t.id, results, false))
    counts[r] = (counts[r] || 0) + 1
    if (r === 'fail') failed.push({ id: t.id, name: t.name, detail: String((results[t.id] || [])[1] || '') })
    const d = names.get(determineTestResult(tests, t.id, results, true))
    fyi[d] = (fyi[d] || 0) + 1
  }
}
console.log(JSON.stringify({ counts, fyi, failed }))
